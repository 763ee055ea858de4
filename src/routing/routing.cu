// Softmax top-k and DeepSeek-V3 grouped sigmoid top-k, one warp per token (routing/topk_warp.cuh).
#include <cuda_bf16.h>

#include "common/cuda_check.hpp"
#include "common/launch.cuh"
#include "routing/routing.hpp"
#include "routing/topk_warp.cuh"

namespace hmoe::routing {
namespace {

constexpr int kWarpsPerBlock = 8;

template <int kPerLane, typename Logit>
__global__ void softmax_topk_kernel(const Logit* __restrict__ logits, int num_tokens, int experts, int top_k,
                                    bool renormalize, int* __restrict__ topk_ids, float* __restrict__ topk_weights) {
  pdl_start();
  const int token = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (token >= num_tokens) return;
  const long long first = static_cast<long long>(token) * top_k;
  softmax_topk_token<kPerLane>(logits + static_cast<long long>(token) * experts, experts, top_k, renormalize,
                               topk_ids + first, topk_weights + first);
}

template <int kPerLane, typename Logit>
__global__ void grouped_topk_kernel(const Logit* __restrict__ logits, const float* __restrict__ correction_bias,
                                    int num_tokens, int experts, int top_k, int num_groups, int topk_groups,
                                    float scaling_factor, int* __restrict__ topk_ids,
                                    float* __restrict__ topk_weights) {
  pdl_start();
  __shared__ float staged_choice[kWarpsPerBlock][kPerLane * 32];
  __shared__ float2 staged_top2[kWarpsPerBlock][32];
  const int warp = threadIdx.x / 32;
  const int token = blockIdx.x * kWarpsPerBlock + warp;
  if (token >= num_tokens) return;
  const long long first = static_cast<long long>(token) * top_k;
  grouped_topk_token<kPerLane>(logits + static_cast<long long>(token) * experts, correction_bias, experts, top_k,
                               num_groups, topk_groups, scaling_factor, staged_choice[warp], staged_top2[warp],
                               topk_ids + first, topk_weights + first);
}

template <int kPerLane, typename Logit>
void launch_for(const MoeSpec& spec, const Logit* logits, const float* correction_bias, int num_tokens,
                int* topk_ids, float* topk_weights, cudaStream_t stream) {
  if (num_tokens == 0) {   // prepare(): only load the kernel this spec uses
    cudaFuncAttributes attributes;
    if (spec.routing.function == RoutingFunction::kSoftmaxTopK)
      HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, softmax_topk_kernel<kPerLane, Logit>));
    else
      HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, grouped_topk_kernel<kPerLane, Logit>));
    return;
  }
  const int blocks = (num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const RoutingSpec& routing = spec.routing;
  // NOTE: no PDL for the first kernel of a layer (the kernel before it is the caller's); its trigger
  // still lets the permute stage launch early.
  if (routing.function == RoutingFunction::kSoftmaxTopK) {
    launch_kernel(false, softmax_topk_kernel<kPerLane, Logit>, blocks, kWarpsPerBlock * 32, 0, stream,
        logits, num_tokens, spec.num_experts, spec.top_k, routing.renormalize, topk_ids, topk_weights);
  } else {
    launch_kernel(false, grouped_topk_kernel<kPerLane, Logit>, blocks, kWarpsPerBlock * 32, 0, stream,
        logits, correction_bias, num_tokens, spec.num_experts, spec.top_k, routing.num_groups,
        routing.topk_groups, routing.routed_scaling_factor, topk_ids, topk_weights);
  }
}

template <typename Logit>
void launch_typed(const MoeSpec& spec, const Logit* logits, const float* correction_bias, int num_tokens,
                  int* topk_ids, float* topk_weights, cudaStream_t stream) {
  const int per_lane = (spec.num_experts + 31) / 32;
  if (per_lane <= 1) return launch_for<1>(spec, logits, correction_bias, num_tokens, topk_ids, topk_weights, stream);
  if (per_lane <= 2) return launch_for<2>(spec, logits, correction_bias, num_tokens, topk_ids, topk_weights, stream);
  if (per_lane <= 4) return launch_for<4>(spec, logits, correction_bias, num_tokens, topk_ids, topk_weights, stream);
  if (per_lane <= 8) return launch_for<8>(spec, logits, correction_bias, num_tokens, topk_ids, topk_weights, stream);
  if (per_lane <= 16) return launch_for<16>(spec, logits, correction_bias, num_tokens, topk_ids, topk_weights, stream);
  return launch_for<32>(spec, logits, correction_bias, num_tokens, topk_ids, topk_weights, stream);
}

}  // namespace

void launch_topk(const MoeSpec& spec, const void* logits, const float* correction_bias, int num_tokens,
                 int* topk_ids, float* topk_weights, cudaStream_t stream) {
  if (spec.routing.logits_dtype == LogitsDType::kFloat32)
    launch_typed(spec, static_cast<const float*>(logits), correction_bias, num_tokens, topk_ids, topk_weights, stream);
  else
    launch_typed(spec, static_cast<const __nv_bfloat16*>(logits), correction_bias, num_tokens, topk_ids,
                 topk_weights, stream);
}

void prepare(const MoeSpec& spec) { launch_topk(spec, nullptr, nullptr, 0, nullptr, nullptr, nullptr); }

}  // namespace hmoe::routing
