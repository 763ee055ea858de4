// Builds the variant table from the generated list (one entry per generated translation unit).
#include "gemm/variants.hpp"

#include <string>
#include <vector>

#include "common/environment.hpp"
#include "hmoe/hmoe.hpp"

namespace hmoe::gemm {

#define HMOE_GEMM_VARIANT(name, epilogue, swap_ab, token_tile, weight_tile, stages, gather, quant) \
  void launch_##name(const GemmLaunch&, cudaStream_t);                                       \
  void prepare_##name();
#include "gemm_variants.inc"
#undef HMOE_GEMM_VARIANT

std::span<const GemmVariant> gemm_variants() {
  static const GemmVariant table[] = {
#define HMOE_GEMM_VARIANT(name, epilogue, swap_ab, token_tile, weight_tile, stages, gather, quant)              \
  {#name, EpilogueKind::epilogue, swap_ab, token_tile, weight_tile, stages, gather, QuantKind::quant, swap_ab,       \
   fuses_requant(EpilogueKind::epilogue, swap_ab, weight_tile, QuantKind::quant), &launch_##name, &prepare_##name},
#include "gemm_variants.inc"
#undef HMOE_GEMM_VARIANT
  };
  return table;
}

const GemmVariant* find_gemm_variant(EpilogueKind epilogue, QuantKind quant, bool swap_ab, int token_tile,
                                     int weight_tile, bool gather_tokens, int stages) {
  for (const GemmVariant& variant : gemm_variants()) {
    if (variant.epilogue == epilogue && variant.quant == quant && variant.swap_ab == swap_ab &&
        variant.token_tile == token_tile && variant.weight_tile == weight_tile && variant.gather_tokens == gather_tokens &&
        (stages == 0 || variant.stages == stages))
      return &variant;
  }
  return nullptr;
}

bool fused_requant_environment() { return environment_switch_on("HMOE_FUSED_REQUANT"); }

bool static_requant_environment() { return environment_switch_on("HMOE_STATIC_REQUANT"); }

QuantKind quant_kind(const MoeSpec& spec) {
  switch (spec.scheme) {
    case QuantScheme::kNone: return QuantKind::kNone;
    case QuantScheme::kPerTensor:
    case QuantScheme::kPerChannelPerToken: return QuantKind::kEpilogueScale;
    case QuantScheme::kBlock128: return QuantKind::kBlockScale;
  }
  return QuantKind::kNone;
}

}  // namespace hmoe::gemm

namespace hmoe {

std::string version() { return HMOE_VERSION; }

std::vector<std::string> compiled_kernels() {
  std::vector<std::string> names;
  for (const gemm::GemmVariant& variant : gemm::gemm_variants()) names.emplace_back(variant.name);
  return names;
}

}  // namespace hmoe
