// Model presets of DESIGN.md §3, spec validation, and the short names the CLI prints.
#include <cmath>
#include <sstream>

#include "hmoe/hmoe.hpp"

namespace hmoe {
namespace {

struct Preset {
  const char* name;
  MoeSpec spec;
};

MoeSpec softmax_spec(int experts, int top_k, int hidden, int intermediate, bool renormalize) {
  MoeSpec spec;
  spec.num_experts = experts;
  spec.top_k = top_k;
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.routing.function = RoutingFunction::kSoftmaxTopK;
  spec.routing.renormalize = renormalize;
  return spec;
}

MoeSpec deepseek_v3_tp8() {
  MoeSpec spec = softmax_spec(256, 8, 7168, 256, false);
  spec.routing.function = RoutingFunction::kGroupedSigmoidTopK;
  spec.routing.num_groups = 8;
  spec.routing.topk_groups = 4;
  spec.routing.routed_scaling_factor = 2.5f;
  return spec;
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = {
      {"mixtral-8x7b", softmax_spec(8, 2, 4096, 14336, true)},
      {"qwen3-30b-a3b", softmax_spec(128, 8, 2048, 768, true)},
      {"qwen3-235b-a22b-tp4", softmax_spec(128, 8, 4096, 384, true)},
      {"deepseek-v3-tp8", deepseek_v3_tp8()},
      {"olmoe-1b-7b", softmax_spec(64, 8, 2048, 1024, false)},
  };
  return table;
}

[[noreturn]] void fail(const std::string& field, long long value, const std::string& expected) {
  std::ostringstream message;
  message << "hmoe: invalid MoeSpec." << field << " = " << value << ": expected " << expected;
  throw Error(message.str());
}

}  // namespace

MoeSpec preset(std::string_view name) {
  for (const Preset& entry : presets()) {
    if (name == entry.name) return entry.spec;
  }
  std::string known;
  for (const Preset& entry : presets()) known += std::string(known.empty() ? "" : ", ") + entry.name;
  throw Error("hmoe: unknown preset '" + std::string(name) + "': expected one of " + known);
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& entry : presets()) names.emplace_back(entry.name);
  return names;
}

void validate(const MoeSpec& spec) {
  // Enums first: a value cast from an out-of-range integer (FFI, deserialised configs) is named.
  if (static_cast<int>(spec.weight_dtype) < 0 || static_cast<int>(spec.weight_dtype) > 1)
    fail("weight_dtype", static_cast<int>(spec.weight_dtype), "0 (bf16) or 1 (fp8-e4m3)");
  if (static_cast<int>(spec.scheme) < 0 || static_cast<int>(spec.scheme) > 3)
    fail("scheme", static_cast<int>(spec.scheme), "0 (none), 1 (fp8-tensor), 2 (fp8-channel) or 3 (fp8-block)");
  if (static_cast<int>(spec.routing.function) < 0 || static_cast<int>(spec.routing.function) > 1)
    fail("routing.function", static_cast<int>(spec.routing.function), "0 (softmax) or 1 (grouped)");
  if (static_cast<int>(spec.routing.logits_dtype) < 0 || static_cast<int>(spec.routing.logits_dtype) > 1)
    fail("routing.logits_dtype", static_cast<int>(spec.routing.logits_dtype), "0 (fp32) or 1 (bf16)");
  if (spec.num_experts < 1 || spec.num_experts > kMaxExperts)
    fail("num_experts", spec.num_experts, "1.." + std::to_string(kMaxExperts));
  if (spec.top_k < 1 || spec.top_k > spec.num_experts || spec.top_k > kMaxTopK)
    fail("top_k", spec.top_k,
         "1..min(num_experts=" + std::to_string(spec.num_experts) + ", " + std::to_string(kMaxTopK) + ")");
  const std::string dim_range = "a multiple of " + std::to_string(kDimAlignment) + " in " +
                                std::to_string(kDimAlignment) + ".." + std::to_string(kMaxDim);
  if (spec.hidden < kDimAlignment || spec.hidden > kMaxDim || spec.hidden % kDimAlignment != 0)
    fail("hidden", spec.hidden, dim_range);
  if (spec.intermediate < kDimAlignment || spec.intermediate > kMaxDim || spec.intermediate % kDimAlignment != 0)
    fail("intermediate", spec.intermediate, dim_range);
  if (spec.weight_dtype == WeightDType::kBF16 && spec.scheme != QuantScheme::kNone)
    fail("scheme", static_cast<int>(spec.scheme), "QuantScheme::kNone for bf16 weights");
  if (spec.weight_dtype == WeightDType::kFP8E4M3 && spec.scheme == QuantScheme::kNone)
    fail("scheme", static_cast<int>(spec.scheme), "an FP8 scheme for fp8 weights");
  if (spec.weight_dtype == WeightDType::kBF16 && spec.ue8m0_scales)
    fail("ue8m0_scales", 1, "false for bf16 weights (UE8M0 rounds FP8 scales)");
  // 128×128 weight blocks and 1×128 activation groups must tile K whole on both GEMMs.
  if (spec.scheme == QuantScheme::kBlock128 && spec.hidden % 128 != 0)
    fail("hidden", spec.hidden, "a multiple of 128 for fp8-block scales (128x128 weight blocks along K)");
  if (spec.scheme == QuantScheme::kBlock128 && spec.intermediate % 128 != 0)
    fail("intermediate", spec.intermediate, "a multiple of 128 for fp8-block scales (128x128 weight blocks along K)");
  const RoutingSpec& routing = spec.routing;
  if (routing.function == RoutingFunction::kGroupedSigmoidTopK) {
    if (routing.num_groups < 1 || routing.num_groups > 32 || spec.num_experts % routing.num_groups != 0)
      fail("routing.num_groups", routing.num_groups,
           "a divisor of num_experts=" + std::to_string(spec.num_experts) + " in 1..32");
    const int group_size = spec.num_experts / routing.num_groups;
    if (group_size < 2)
      fail("routing.num_groups", routing.num_groups, "at least 2 experts per group (group score = top-2 sum)");
    if (routing.topk_groups < 1 || routing.topk_groups > routing.num_groups)
      fail("routing.topk_groups", routing.topk_groups, "1..num_groups=" + std::to_string(routing.num_groups));
    if (spec.top_k > routing.topk_groups * group_size)
      fail("top_k", spec.top_k, "at most topk_groups × experts per group = " +
                                    std::to_string(routing.topk_groups * group_size));
    if (!(routing.routed_scaling_factor > 0.0f) || !std::isfinite(routing.routed_scaling_factor)) {
      std::ostringstream message;
      message << "hmoe: invalid MoeSpec.routing.routed_scaling_factor = " << routing.routed_scaling_factor
              << ": expected a finite value > 0";
      throw Error(message.str());
    }
  }
}

std::string to_string(WeightDType value) {
  return value == WeightDType::kBF16 ? "bf16" : "fp8-e4m3";
}

std::string to_string(QuantScheme value) {
  switch (value) {
    case QuantScheme::kNone: return "none";
    case QuantScheme::kPerTensor: return "fp8-tensor";
    case QuantScheme::kPerChannelPerToken: return "fp8-channel";
    case QuantScheme::kBlock128: return "fp8-block";
  }
  return "?";
}

std::string to_string(RoutingFunction value) {
  return value == RoutingFunction::kSoftmaxTopK ? "softmax" : "grouped";
}

std::string to_string(Orientation value) {
  switch (value) {
    case Orientation::kAuto: return "auto";
    case Orientation::kNormal: return "normal";
    case Orientation::kSwapAB: return "swap";
  }
  return "?";
}

}  // namespace hmoe
