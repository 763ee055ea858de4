// Decode sizes: routing from logits and the whole permute stage in one block, one launch instead of
// two before GEMM1. Warp w routes token w with the routing stage's own warp functions
// (routing/topk_warp.cuh), so ids and weights are the bits the routing kernel writes; the block then
// runs the single-block permute on them.
#include <cuda_bf16.h>

#include "common/cuda_check.hpp"
#include "common/launch.cuh"
#include "permute/permute.hpp"
#include "permute/single_block.cuh"
#include "routing/topk_warp.cuh"

namespace hmoe::permute {
namespace {

struct RouteArgs {
  int num_tokens;
  int experts;
  int top_k;
  bool renormalize;        // softmax top-k
  int num_groups;          // grouped sigmoid top-k
  int topk_groups;
  float scaling_factor;
};

template <int kPerLane, typename Logit, bool kGrouped>
__global__ void __launch_bounds__(kScanThreads) route_permute_kernel(
    const Logit* __restrict__ logits, const float* __restrict__ correction_bias, RouteArgs route,
    int* __restrict__ topk_ids, float* __restrict__ topk_weights, int token_tile, int* __restrict__ expert_offsets,
    int* __restrict__ num_tiles, TokenTile* __restrict__ tiles, int* __restrict__ slot_rows,
    float* __restrict__ row_weights, int* __restrict__ sorted_tokens, int* __restrict__ invalid_id_count,
    ZeroedSlots zeroed) {
  pdl_start();
  __shared__ float staged_choice[kGrouped ? kRoutePermuteTokens : 1][kGrouped ? kPerLane * 32 : 1];
  __shared__ float2 staged_top2[kGrouped ? kRoutePermuteTokens : 1][32];
  const int warp = threadIdx.x / 32;
  if (warp < route.num_tokens) {
    const Logit* row = logits + static_cast<long long>(warp) * route.experts;
    const long long first = static_cast<long long>(warp) * route.top_k;
    if constexpr (kGrouped) {
      routing::grouped_topk_token<kPerLane>(row, correction_bias, route.experts, route.top_k, route.num_groups,
                                            route.topk_groups, route.scaling_factor, staged_choice[warp],
                                            staged_top2[warp], topk_ids + first, topk_weights + first);
    } else {
      routing::softmax_topk_token<kPerLane>(row, route.experts, route.top_k, route.renormalize, topk_ids + first,
                                            topk_weights + first);
    }
  }
  __syncthreads();   // the block's global writes above are visible to all its threads
  permute_block(topk_ids, topk_weights, route.num_tokens * route.top_k, route.top_k, route.experts, token_tile,
                expert_offsets, num_tiles, tiles, slot_rows, row_weights, sorted_tokens, invalid_id_count,
                zeroed);
}

template <int kPerLane, typename Logit, bool kGrouped>
void launch_for(const void* logits, const float* correction_bias, const RouteArgs& route, int* topk_ids,
                float* topk_weights, int token_tile, const PermuteBuffers& buffers, int* invalid_id_count,
                cudaStream_t stream) {
  const auto kernel = route_permute_kernel<kPerLane, Logit, kGrouped>;
  if (route.num_tokens == 0) {   // prepare(): load the kernel (module loading is lazy)
    cudaFuncAttributes attributes;
    HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    return;
  }
  // NOTE: no PDL for the first kernel of a layer (the kernel before it is the caller's).
  launch_kernel(false, kernel, 1, kScanThreads, 0, stream, static_cast<const Logit*>(logits), correction_bias, route,
                topk_ids, topk_weights, token_tile, buffers.expert_offsets, buffers.num_tiles, buffers.tiles,
                buffers.slot_rows, buffers.row_weights, buffers.sorted_tokens, invalid_id_count,
                buffers.zeroed);
}

template <typename Logit, bool kGrouped>
void launch_typed(const MoeSpec& spec, const void* logits, const float* correction_bias, const RouteArgs& route,
                  int* topk_ids, float* topk_weights, int token_tile, const PermuteBuffers& buffers,
                  int* invalid_id_count, cudaStream_t stream) {
  const int per_lane = (spec.num_experts + 31) / 32;
  if (per_lane <= 1)
    return launch_for<1, Logit, kGrouped>(logits, correction_bias, route, topk_ids, topk_weights, token_tile, buffers,
                                          invalid_id_count, stream);
  if (per_lane <= 2)
    return launch_for<2, Logit, kGrouped>(logits, correction_bias, route, topk_ids, topk_weights, token_tile, buffers,
                                          invalid_id_count, stream);
  if (per_lane <= 4)
    return launch_for<4, Logit, kGrouped>(logits, correction_bias, route, topk_ids, topk_weights, token_tile, buffers,
                                          invalid_id_count, stream);
  return launch_for<8, Logit, kGrouped>(logits, correction_bias, route, topk_ids, topk_weights, token_tile, buffers,
                                        invalid_id_count, stream);
}

void launch_any(const MoeSpec& spec, const void* logits, const float* correction_bias, int num_tokens, int* topk_ids,
                float* topk_weights, int token_tile, const PermuteBuffers& buffers, int* invalid_id_count,
                cudaStream_t stream) {
  const RoutingSpec& routing = spec.routing;
  const RouteArgs route{num_tokens, spec.num_experts, spec.top_k, routing.renormalize, routing.num_groups,
                        routing.topk_groups, routing.routed_scaling_factor};
  const bool grouped = routing.function == RoutingFunction::kGroupedSigmoidTopK;
  const bool bf16 = routing.logits_dtype != LogitsDType::kFloat32;
  if (grouped && bf16)
    launch_typed<__nv_bfloat16, true>(spec, logits, correction_bias, route, topk_ids, topk_weights, token_tile,
                                      buffers, invalid_id_count, stream);
  else if (grouped)
    launch_typed<float, true>(spec, logits, correction_bias, route, topk_ids, topk_weights, token_tile, buffers,
                              invalid_id_count, stream);
  else if (bf16)
    launch_typed<__nv_bfloat16, false>(spec, logits, correction_bias, route, topk_ids, topk_weights, token_tile,
                                       buffers, invalid_id_count, stream);
  else
    launch_typed<float, false>(spec, logits, correction_bias, route, topk_ids, topk_weights, token_tile, buffers,
                               invalid_id_count, stream);
}

}  // namespace

bool route_permute_applies(const MoeSpec& spec, int num_tokens) {
  return num_tokens >= 1 && num_tokens <= kRoutePermuteTokens && spec.num_experts <= kRoutePermuteExperts &&
         num_tokens * spec.top_k <= kSingleBlockEntries;
}

void launch_route_permute(const MoeSpec& spec, const void* logits, const float* correction_bias, int num_tokens,
                          int* topk_ids, float* topk_weights, int token_tile, const PermuteBuffers& buffers,
                          int* invalid_id_count, cudaStream_t stream) {
  if (!route_permute_applies(spec, num_tokens))
    throw Error("hmoe: internal error: the fused routing + permute kernel does not apply to T = " +
                std::to_string(num_tokens) + ", E = " + std::to_string(spec.num_experts));
  launch_any(spec, logits, correction_bias, num_tokens, topk_ids, topk_weights, token_tile, buffers, invalid_id_count,
             stream);
}

void prepare_route_permute(const MoeSpec& spec) {
  if (spec.num_experts > kRoutePermuteExperts) return;
  launch_any(spec, nullptr, nullptr, 0, nullptr, nullptr, 1, PermuteBuffers{}, nullptr, nullptr);
}

}  // namespace hmoe::permute
