// Constraints and pairing of the compiled GEMM variants, read by choose_plan, the tuned-table
// loader, the tuner and `hmoe info --kernels`.
#include "dispatch/registry.hpp"

#include <algorithm>
#include <tuple>

namespace hmoe::dispatch {

GemmConstraints constraints_of(const gemm::GemmVariant& variant) {
  GemmConstraints constraints;
  switch (variant.quant) {
    case gemm::QuantKind::kNone: break;
    case gemm::QuantKind::kEpilogueScale:
      constraints.dtype = WeightDType::kFP8E4M3;
      constraints.schemes = {QuantScheme::kPerTensor, QuantScheme::kPerChannelPerToken};
      break;
    case gemm::QuantKind::kBlockScale:
      constraints.dtype = WeightDType::kFP8E4M3;
      constraints.schemes = {QuantScheme::kBlock128};
      constraints.dim_alignment = gemm::kScaleGroup;
      break;
  }
  return constraints;
}

std::string GemmConstraints::scheme_names() const {
  std::string names;
  for (QuantScheme scheme : schemes) names += (names.empty() ? "" : "|") + to_string(scheme);
  return names;
}

bool supports(const gemm::GemmVariant& variant, const MoeSpec& spec, std::string* why) {
  const GemmConstraints constraints = constraints_of(variant);
  auto fail = [why, &variant](const std::string& reason) {
    if (why != nullptr) *why = std::string(variant.name) + ": " + reason;
    return false;
  };
  const bool scheme_ok =
      std::find(constraints.schemes.begin(), constraints.schemes.end(), spec.scheme) != constraints.schemes.end();
  if (spec.weight_dtype != constraints.dtype || !scheme_ok)
    return fail("reads " + to_string(constraints.dtype) + " weights (" + constraints.scheme_names() +
                "), the layer has " + to_string(spec.weight_dtype) + " (" + to_string(spec.scheme) + ")");
  if (spec.hidden % constraints.dim_alignment != 0 || spec.intermediate % constraints.dim_alignment != 0)
    return fail("needs H and I to be multiples of " + std::to_string(constraints.dim_alignment) +
                " (H = " + std::to_string(spec.hidden) + ", I = " + std::to_string(spec.intermediate) + ")");
  return true;
}

const char* orientation_name(const gemm::GemmVariant& variant) { return variant.swap_ab ? "swap" : "normal"; }

const gemm::GemmVariant* find_gemm_variant_by_name(std::string_view name) {
  for (const gemm::GemmVariant& variant : gemm::gemm_variants())
    if (name == variant.name) return &variant;
  return nullptr;
}

std::string PlanVariant::id() const { return std::string(gemm1->name) + "+" + gemm2->name; }

std::string PlanVariant::summary() const {
  return std::string(orientation_name(*gemm1)) + " t" + std::to_string(gemm1->token_tile) + " w" +
         std::to_string(gemm1->weight_tile) + "/w" + std::to_string(gemm2->weight_tile);
}

bool valid_plan_variant(const PlanVariant& variant, const MoeSpec& spec, std::string* why) {
  auto fail = [why](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  if (variant.gemm1 == nullptr || variant.gemm2 == nullptr) return fail("missing GEMM variant");
  if (variant.gemm1->epilogue != gemm::EpilogueKind::kSwiGlu)
    return fail(std::string(variant.gemm1->name) + " is not a GEMM1 (SwiGLU epilogue) variant");
  if (variant.gemm2->epilogue != gemm::EpilogueKind::kRoutingWeight)
    return fail(std::string(variant.gemm2->name) + " is not a GEMM2 (routing-weight epilogue) variant");
  if (variant.gemm1->swap_ab != variant.gemm2->swap_ab || variant.gemm1->token_tile != variant.gemm2->token_tile)
    return fail(std::string(variant.gemm1->name) + " and " + variant.gemm2->name +
                " differ in orientation or token tile (both GEMMs walk one work list)");
  return supports(*variant.gemm1, spec, why) && supports(*variant.gemm2, spec, why);
}

PlanVariant parse_plan_variant(std::string_view id, const MoeSpec& spec) {
  const std::size_t plus = id.find('+');
  if (plus == std::string_view::npos)
    throw Error("hmoe: variant '" + std::string(id) + "': expected '<gemm1 kernel>+<gemm2 kernel>'");
  PlanVariant variant{find_gemm_variant_by_name(id.substr(0, plus)), find_gemm_variant_by_name(id.substr(plus + 1))};
  for (const auto& [found, name] : {std::pair{variant.gemm1, id.substr(0, plus)}, {variant.gemm2, id.substr(plus + 1)}})
    if (found == nullptr) throw Error("hmoe: variant '" + std::string(id) + "': no compiled kernel '" + std::string(name) + "'");
  std::string why;
  if (!valid_plan_variant(variant, spec, &why)) throw Error("hmoe: variant '" + std::string(id) + "': " + why);
  return variant;
}

int granule_rank(const gemm::GemmVariant& variant) { return (variant.swap_ab ? 0 : 1 << 16) + variant.token_tile; }

std::vector<PlanVariant> eligible_plan_variants(const MoeSpec& spec) {
  std::vector<PlanVariant> variants;
  for (const gemm::GemmVariant& gemm1 : gemm::gemm_variants()) {
    for (const gemm::GemmVariant& gemm2 : gemm::gemm_variants()) {
      const PlanVariant candidate{&gemm1, &gemm2};
      if (valid_plan_variant(candidate, spec)) variants.push_back(candidate);
    }
  }
  std::sort(variants.begin(), variants.end(), [](const PlanVariant& a, const PlanVariant& b) {
    return std::tuple(granule_rank(*a.gemm1), a.gemm1->weight_tile, a.gemm2->weight_tile) <
           std::tuple(granule_rank(*b.gemm1), b.gemm1->weight_tile, b.gemm2->weight_tile);
  });
  return variants;
}

}  // namespace hmoe::dispatch
