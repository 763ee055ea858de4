// The routing functions at warp level: one whole warp routes one token with the token's scores in
// registers (lane l holds experts l, l+32, ...); ties break to the lower expert index. Used by the
// routing stage's kernels (routing.cu) and by the permute stage's fused decode kernel
// (permute/route_permute.cu), so both give the same bits.
#pragma once

#include <cuda_bf16.h>

#include <climits>

namespace hmoe::routing {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float load_logit(const float* row, int e) { return row[e]; }
__device__ __forceinline__ float load_logit(const __nv_bfloat16* row, int e) { return __bfloat162float(row[e]); }

// True when (value, index) ranks above (best_value, best_index): larger value, ties to lower index.
// NaN never ranks above anything.
__device__ __forceinline__ bool ranks_above(float value, int index, float best_value, int best_index) {
  return value > best_value || (value == best_value && index < best_index);
}

__device__ __forceinline__ void warp_argmax(float& value, int& index) {
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_value = __shfl_xor_sync(kFullMask, value, offset);
    const int other_index = __shfl_xor_sync(kFullMask, index, offset);
    if (ranks_above(other_value, other_index, value, index)) {
      value = other_value;
      index = other_index;
    }
  }
}

// Picks the best not-yet-taken entry among `score` (restricted to `eligible`), marks it taken and
// returns its expert id (INT_MAX when nothing is left).
template <int kPerLane>
__device__ int take_best(const float (&score)[kPerLane], unsigned eligible, unsigned& taken, int lane) {
  float best_value = -INFINITY;
  int best_index = INT_MAX;
  #pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int expert = i * 32 + lane;
    const bool open = ((eligible >> i) & 1u) && !((taken >> i) & 1u) && !isnan(score[i]);
    if (open && ranks_above(score[i], expert, best_value, best_index)) {
      best_value = score[i];
      best_index = expert;
    }
  }
  warp_argmax(best_value, best_index);
  if (best_index != INT_MAX && best_index % 32 == lane) taken |= 1u << (best_index / 32);
  return best_index;
}

// Softmax top-k of one token, by one whole warp: `row` its E logits, ids/weights its k outputs.
template <int kPerLane, typename Logit>
__device__ void softmax_topk_token(const Logit* __restrict__ row, int experts, int top_k, bool renormalize,
                                   int* __restrict__ ids, float* __restrict__ weights) {
  const int lane = threadIdx.x % 32;

  float score[kPerLane];
  unsigned eligible = 0;
  float row_max = -INFINITY;
  #pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int expert = i * 32 + lane;
    score[i] = expert < experts ? load_logit(row, expert) : -INFINITY;
    if (expert < experts) eligible |= 1u << i;
    row_max = fmaxf(row_max, score[i]);
  }
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, offset));
  float sum = 0.0f;
  #pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if ((eligible >> i) & 1u) sum += __expf(score[i] - row_max);
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);

  // NOTE: selecting on logits rather than probabilities keeps distinct logits distinct (exp can
  // round two close logits to one float), the order softmax preserves exactly.
  unsigned taken = 0;
  float chosen_sum = 0.0f;
  float my_weight = 0.0f;
  int my_id = -1;
  for (int slot = 0; slot < top_k; ++slot) {
    const int expert = take_best(score, eligible, taken, lane);
    float probability = 0.0f;
    // The owner lane of the chosen expert broadcasts its logit.
    float chosen_logit = -INFINITY;
    #pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (expert != INT_MAX && i * 32 + lane == expert) chosen_logit = score[i];
    const int owner = expert != INT_MAX ? expert % 32 : 0;
    chosen_logit = __shfl_sync(kFullMask, chosen_logit, owner);
    if (expert != INT_MAX) probability = __expf(chosen_logit - row_max) / sum;
    chosen_sum += probability;
    if (lane == slot) {
      my_id = expert != INT_MAX ? expert : -1;
      my_weight = probability;
    }
  }
  if (lane < top_k) {
    ids[lane] = my_id;
    weights[lane] = renormalize && chosen_sum > 0.0f ? my_weight / chosen_sum : my_weight;
  }
}

// DeepSeek-V3 grouped sigmoid top-k of one token, by one whole warp: `row` its E logits, ids/weights
// its k outputs; staged_choice [kPerLane·32] and staged_top2 [32] are this warp's shared memory.
template <int kPerLane, typename Logit>
__device__ void grouped_topk_token(const Logit* __restrict__ row, const float* __restrict__ correction_bias,
                                   int experts, int top_k, int num_groups, int topk_groups, float scaling_factor,
                                   float* staged_choice, float2* staged_top2, int* __restrict__ ids,
                                   float* __restrict__ weights) {
  const int lane = threadIdx.x % 32;
  const int group_size = experts / num_groups;

  float sigmoid[kPerLane];
  float choice[kPerLane];   // sigmoid + correction bias: what experts and groups are ranked by
  // Each expert's group, divided once rather than in every pass of the group loop below (a division
  // by the run-time group size is ~20 dependent instructions; 64 of them for deepseek-v3's 256
  // experts in 8 groups): −1.5 to −2 µs of deepseek-v3's T = 1 layer on H200 (docs/PERF.md).
  int group_of[kPerLane];
  // Every logit and bias load is issued before the first sigmoid: the compiler does not move loads
  // across the division's slow path, so loading inside the loop below made kPerLane dependent
  // round trips to memory (2 × 8 for deepseek-v3). Same arithmetic, same bits.
  float logit[kPerLane], bias[kPerLane];
  #pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int expert = i * 32 + lane;
    logit[i] = expert < experts ? load_logit(row, expert) : 0.0f;
    bias[i] = expert < experts && correction_bias != nullptr ? correction_bias[expert] : 0.0f;
  }
  unsigned valid = 0;
  #pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int expert = i * 32 + lane;
    group_of[i] = expert / group_size;
    sigmoid[i] = 0.0f;
    choice[i] = -INFINITY;
    if (expert < experts) {
      valid |= 1u << i;
      sigmoid[i] = 1.0f / (1.0f + __expf(-logit[i]));
      choice[i] = sigmoid[i] + bias[i];
    }
  }

  // Group score = sum of the two best choice values in the group; lane g keeps group g's score.
  // NOTE: one warp-wide reduction per group in turn was the kernel's longest dependent chain (8 ×
  // (8 slot tests + 5 shuffle rounds) for deepseek-v3, one warp running ~10 µs for one token on
  // H200); instead the choices are staged in shared memory and all groups are scanned at once,
  // lanes_per_group lanes a group, whose partial top-2s the group's lane merges. Same values
  // summed as before (the two largest non-NaN choices), so the same bits.
  #pragma unroll
  for (int i = 0; i < kPerLane; ++i) staged_choice[i * 32 + lane] = choice[i];
  __syncwarp();
  const auto keep_top2 = [](float value, float& first, float& second) {
    if (value > first) {
      second = first;
      first = value;
    } else if (value > second) {
      second = value;
    }
  };
  const int lanes_per_group = 32 / num_groups;   // ≥ 1: at most 32 groups
  {
    const int group = lane / lanes_per_group, part = lane % lanes_per_group;
    float first = -INFINITY, second = -INFINITY;
    if (group < num_groups) {
      for (int expert = group * group_size + part; expert < (group + 1) * group_size; expert += lanes_per_group)
        keep_top2(staged_choice[expert], first, second);
    }
    staged_top2[lane] = make_float2(first, second);
  }
  __syncwarp();
  float group_score = -INFINITY;
  if (lane < num_groups) {
    float first = -INFINITY, second = -INFINITY;
    for (int part = 0; part < lanes_per_group; ++part) {
      const float2 partial = staged_top2[lane * lanes_per_group + part];
      keep_top2(partial.x, first, second);
      keep_top2(partial.y, first, second);
    }
    group_score = first + second;
  }

  // Keep the topk_groups best groups (ties to the lower group index).
  unsigned kept_groups = 0;
  {
    const float score[1] = {group_score};
    unsigned taken = 0;
    for (int round = 0; round < topk_groups; ++round) {
      const int group = take_best<1>(score, lane < num_groups ? 1u : 0u, taken, lane);
      if (group != INT_MAX) kept_groups |= 1u << group;
    }
  }
  unsigned eligible = 0;
  #pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (((valid >> i) & 1u) && ((kept_groups >> group_of[i]) & 1u)) eligible |= 1u << i;

  unsigned taken = 0;
  float chosen_sum = 0.0f;
  float my_weight = 0.0f;
  int my_id = -1;
  for (int slot = 0; slot < top_k; ++slot) {
    const int expert = take_best(choice, eligible, taken, lane);
    float chosen_sigmoid = 0.0f;
    #pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (expert != INT_MAX && i * 32 + lane == expert) chosen_sigmoid = sigmoid[i];
    chosen_sigmoid = __shfl_sync(kFullMask, chosen_sigmoid, expert != INT_MAX ? expert % 32 : 0);
    chosen_sum += chosen_sigmoid;
    if (lane == slot) {
      my_id = expert != INT_MAX ? expert : -1;
      my_weight = chosen_sigmoid;
    }
  }
  if (lane < top_k) {
    ids[lane] = my_id;
    weights[lane] = chosen_sum > 0.0f ? my_weight / chosen_sum * scaling_factor : 0.0f;
  }
}

}  // namespace hmoe::routing
