// Host side of the fused decode layer (decode_layer.hpp): when it applies, its shared memory, the
// kernel arguments, and the cooperative launch (decode_instances.cuh).
#include "decode/decode_layer.hpp"

#include "common/cuda_check.hpp"
#include "decode/decode_layer.cuh"

namespace hmoe::decode {
namespace {

// Dynamic shared memory the kernel may use (227 KB per block on sm_90, less its static arrays).
constexpr std::size_t kMaxSharedBytes = 200 * 1024;

std::size_t shared_bytes(const MoeSpec& spec, int num_tokens) {
  return 4 * static_cast<std::size_t>(activation_floats(num_tokens, spec.top_k, spec.hidden, spec.intermediate) +
                                      scale_floats(num_tokens, spec.top_k, spec.hidden, spec.intermediate));
}

Scheme scheme_of(const MoeSpec& spec) {
  if (spec.weight_dtype != WeightDType::kFP8E4M3) return Scheme::kBf16;
  switch (spec.scheme) {
    case QuantScheme::kPerTensor: return Scheme::kTensor;
    case QuantScheme::kPerChannelPerToken: return Scheme::kChannel;
    case QuantScheme::kBlock128: return Scheme::kBlock;
    case QuantScheme::kNone: break;
  }
  throw Error("hmoe: internal error: an FP8 spec without a scheme reached the fused decode layer");
}

void dispatch_scheme(const MoeSpec& spec, const KernelArgs* args, int num_sms, std::size_t bytes, cudaStream_t stream) {
  const int per_lane = (spec.num_experts + 31) / 32;
  switch (scheme_of(spec)) {
    case Scheme::kBf16: return launch_scheme<Scheme::kBf16>(args, per_lane, num_sms, bytes, stream);
    case Scheme::kTensor: return launch_scheme<Scheme::kTensor>(args, per_lane, num_sms, bytes, stream);
    case Scheme::kChannel: return launch_scheme<Scheme::kChannel>(args, per_lane, num_sms, bytes, stream);
    case Scheme::kBlock: return launch_scheme<Scheme::kBlock>(args, per_lane, num_sms, bytes, stream);
  }
}

}  // namespace

bool applies(const MoeSpec& spec, int num_tokens) {
  return num_tokens >= 1 && num_tokens <= kMaxTokens && num_tokens * spec.top_k <= kMaxSlots &&
         spec.num_experts <= kMaxExperts && shared_bytes(spec, num_tokens) <= kMaxSharedBytes;
}

std::string kernel_name(const MoeSpec& spec) {
  switch (scheme_of(spec)) {
    case Scheme::kBf16: return "decode_layer";
    case Scheme::kTensor: return "decode_layer_fp8tensor";
    case Scheme::kChannel: return "decode_layer_fp8channel";
    case Scheme::kBlock: return "decode_layer_fp8block";
  }
  return "decode_layer";
}

void launch(const MoeSpec& spec, const DecodeLaunch& launch, int num_sms, cudaStream_t stream) {
  if (!applies(spec, launch.num_tokens))
    throw Error("hmoe: internal error: the fused decode layer does not apply to T = " +
                std::to_string(launch.num_tokens));
  const RoutingSpec& routing = spec.routing;
  KernelArgs args{};
  args.num_tokens = launch.num_tokens;
  args.experts = spec.num_experts;
  args.top_k = spec.top_k;
  args.hidden = spec.hidden;
  args.intermediate = spec.intermediate;
  args.logits = launch.router_logits;
  args.logits_bf16 = routing.logits_dtype == LogitsDType::kBFloat16;
  args.grouped = routing.function == RoutingFunction::kGroupedSigmoidTopK;
  args.renormalize = routing.renormalize;
  args.ue8m0 = spec.ue8m0_scales;
  args.num_groups = routing.num_groups;
  args.topk_groups = routing.topk_groups;
  args.scaling_factor = routing.routed_scaling_factor;
  args.correction_bias = launch.weights.correction_bias;
  args.topk_ids = launch.topk_ids;
  args.topk_weights = launch.topk_weights;
  args.routed_ids = launch.routed_ids;
  args.routed_weights = launch.routed_weights;
  args.x = static_cast<const __nv_bfloat16*>(launch.x);
  args.out = static_cast<__nv_bfloat16*>(launch.out);
  args.w13 = static_cast<const uint4*>(launch.weights.w13);
  args.w2 = static_cast<const uint4*>(launch.weights.w2);
  args.w13_scale = launch.weights.w13_scale;
  args.w2_scale = launch.weights.w2_scale;
  args.act_scale = launch.act_scale;
  args.intermediate_act_scale = launch.intermediate_act_scale;
  args.swiglu = static_cast<__nv_bfloat16*>(launch.intermediate);
  args.invalid_id_count = launch.invalid_id_count;
  dispatch_scheme(spec, &args, num_sms, shared_bytes(spec, launch.num_tokens), stream);
}

void prepare(const MoeSpec& spec) {
  if (!applies(spec, 1)) return;
  dispatch_scheme(spec, nullptr, 0, kMaxSharedBytes, nullptr);
}

}  // namespace hmoe::decode
