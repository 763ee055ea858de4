// The fused decode layer's kernel (decode_layer.hpp), instantiated per weight scheme by
// decode_bf16.cu and decode_fp8.cu.
//
// One CTA of kThreads per SM, launched cooperatively. Per CTA:
//  1. warps 0..T-1 route token w (routing/topk_warp.cuh, the routing kernel's bits) or read the
//     caller's top-k, while the other warps load x into shared memory as fp32 (float4s permuted
//     within each weight vector's columns, see swizzled()); FP8 layers then
//     quantise it (quant/fp8.cuh: the scales and e4m3 values the quantisation kernels write) and
//     keep the e4m3 values as fp32 with their scales apart;
//  2. warp 0 groups the valid slots by expert ("hits": distinct experts, a slot mask each);
//  3. GEMM1 + SwiGLU: a warp task is one intermediate column j of one hit — its gate and up weight
//     rows (prepared w13 groups 8 gate rows with the 8 up rows of the same columns) dotted with the
//     hit's tokens; the bf16 SwiGLU output goes to the workspace [T·k, I];
//  4. grid-wide barrier;
//  5. the SwiGLU output of every slot into shared memory (FP8: re-quantised, same rule as above);
//  6. GEMM2 + combine: a warp task is one output column n of every token — w2 row n of each hit
//     dotted with the hit's slots, × routing weight, summed per token in a fixed order, one bf16
//     rounding at the end.
// Warp tasks are spread over every warp of the grid; each lane keeps kBatch1 / kBatch2 16-byte weight
// vectors per row in flight. Deterministic: the task → warp → lane mapping and every sum order are fixed.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <climits>
#include <cstdint>

#include "decode/decode_layer.hpp"
#include "gemm/config.hpp"
#include "quant/fp8.cuh"
#include "routing/topk_warp.cuh"

namespace hmoe::decode {

enum class Scheme { kBf16, kTensor, kChannel, kBlock };

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
// 16-byte weight vectors each lane has in flight: GEMM1 per row (gate and up: twice that), GEMM2.
// 16 warps × 32 lanes × 8 × 16 B = 64 KB per SM, about twice what HBM latency × bandwidth needs.
inline constexpr int kBatch1 = 4;
inline constexpr int kBatch2 = 8;
inline constexpr int kGroup = 128;   // FP8 block / activation group width

struct KernelArgs {
  int num_tokens, experts, top_k, hidden, intermediate;
  const void* logits;
  bool logits_bf16, grouped, renormalize, ue8m0;
  int num_groups, topk_groups;
  float scaling_factor;
  const float* correction_bias;
  const std::int32_t* topk_ids;
  const float* topk_weights;
  std::int32_t* routed_ids;
  float* routed_weights;
  const __nv_bfloat16* x;
  __nv_bfloat16* out;
  const uint4* w13;
  const uint4* w2;
  const float* w13_scale;
  const float* w2_scale;
  const float* act_scale;
  const float* intermediate_act_scale;
  __nv_bfloat16* swiglu;   // [T·k, I] workspace
  int* invalid_id_count;
};

// Shared memory the host sizes: fp32 activations [rows, cols] and their FP8 scales, for x
// (T × H) and then the SwiGLU output (T·k × I).
__host__ __device__ constexpr int groups_of(int cols) { return (cols + kGroup - 1) / kGroup; }
__host__ __device__ constexpr long long activation_floats(int tokens, int top_k, int hidden, int intermediate) {
  const long long x = static_cast<long long>(tokens) * hidden;
  const long long h = static_cast<long long>(tokens) * top_k * intermediate;
  return ((x > h ? x : h) + 3) / 4 * 4;
}
__host__ __device__ constexpr long long scale_floats(int tokens, int top_k, int hidden, int intermediate) {
  const long long x = static_cast<long long>(tokens) * groups_of(hidden);
  const long long h = static_cast<long long>(tokens) * top_k * groups_of(intermediate);
  return (x > h ? x : h) + 4;
}

template <Scheme kScheme>
struct Traits {
  static constexpr bool kFp8 = kScheme != Scheme::kBf16;
  static constexpr int kPerVector = kFp8 ? 16 : 8;   // elements per 16-byte vector
  static constexpr int kQuads = kPerVector / 4;       // float4s of activations per vector
};

// Activations live in shared memory as float4s, and the float4s of one weight vector's columns are
// stored permuted by the vector's index: a warp reads vector v = lane + 32·b, so without it the
// lanes of one quarter-warp would hit 4 (FP8) or 2 (bf16) times the same banks. The permutation
// stays within each vector (kQuads float4s), so the quantisation, which sees only groups of whole
// vectors and elementwise values, is unaffected. Row starts are multiples of 8 float4s.
template <int kQuads>
__device__ __forceinline__ long long swizzled(long long quad) {
  return quad ^ ((quad >> 3) & (kQuads - 1));
}

// Stores bf16 vector v (8 values) of a row-major bf16 matrix as fp32 into shared memory: float4s
// 2v and 2v + 1, permuted as swizzled() says.
template <int kQuads>
__device__ __forceinline__ void stage_bf16_vector(float4* act, long long v, const uint4& w) {
  act[swizzled<kQuads>(2 * v)] = make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                                             __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
  act[swizzled<kQuads>(2 * v + 1)] = make_float4(__uint_as_float(w.z << 16), __uint_as_float(w.z & 0xffff0000u),
                                                 __uint_as_float(w.w << 16), __uint_as_float(w.w & 0xffff0000u));
}

// Σ of one 16-byte weight vector times the activations of its columns, float4s [quad, quad + kQuads).
__device__ __forceinline__ float dot_vector(const uint4& w, const float4* act, long long quad, Traits<Scheme::kBf16>) {
  const float4 a = act[swizzled<2>(quad)];
  const float4 b = act[swizzled<2>(quad + 1)];
  float sum = __uint_as_float(w.x << 16) * a.x;
  sum = fmaf(__uint_as_float(w.x & 0xffff0000u), a.y, sum);
  sum = fmaf(__uint_as_float(w.y << 16), a.z, sum);
  sum = fmaf(__uint_as_float(w.y & 0xffff0000u), a.w, sum);
  sum = fmaf(__uint_as_float(w.z << 16), b.x, sum);
  sum = fmaf(__uint_as_float(w.z & 0xffff0000u), b.y, sum);
  sum = fmaf(__uint_as_float(w.w << 16), b.z, sum);
  sum = fmaf(__uint_as_float(w.w & 0xffff0000u), b.w, sum);
  return sum;
}

__device__ __forceinline__ float2 e4m3_pair(unsigned bits) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bits & 0xffffu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&raw));
}

template <Scheme kScheme>
__device__ __forceinline__ float dot_vector(const uint4& w, const float4* act, long long quad, Traits<kScheme>) {
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  float sum = 0.0f;
  #pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float4 a = act[swizzled<4>(quad + q)];
    const float2 low = e4m3_pair(words[q]), high = e4m3_pair(words[q] >> 16);
    sum = fmaf(low.x, a.x, sum);
    sum = fmaf(low.y, a.y, sum);
    sum = fmaf(high.x, a.z, sum);
    sum = fmaf(high.y, a.w, sum);
  }
  return sum;
}

__device__ __forceinline__ float warp_sum(float value) {
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// A weight vector read once per run: not kept in L1, and the L2 fetches the 256 bytes around it (the
// warp's next vectors of the same row), so fewer requests keep more bytes in flight.
__device__ __forceinline__ uint4 load_streaming(const uint4* pointer) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(pointer));
  return v;
}

__device__ __forceinline__ float e4m3_value(float value, float scale) {
  const __half_raw raw = __nv_cvt_fp8_to_halfraw(quant::to_e4m3(value, scale), __NV_E4M3);
  return __half2float(__half(raw));
}

// Largest |value| over the block's threads (every thread gets it). scratch: kWarps floats.
__device__ inline float block_max(float value, float* scratch) {
  value = warp_max(value);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = value;
  __syncthreads();
  float result = scratch[0];
  #pragma unroll
  for (int w = 1; w < kWarps; ++w) result = fmaxf(result, scratch[w]);
  return result;
}

// Quantises rows [rows, cols] of fp32 values in shared memory in place (to their e4m3 values, as
// fp32) with the scheme's dynamic scales — per 1×128 group (scales [rows, groups_of(cols)]), per
// row (scales [rows]) or per tensor (scales[0]; static_scale when given) — the rule of
// quant/activations.cu. Rows with row_valid false are skipped (and not in a tensor's amax).
template <Scheme kScheme, typename Valid>
__device__ void quantize_rows(float* values, float* scales, int rows, int cols, const float* static_scale, bool ue8m0,
                              Valid row_valid, float* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if constexpr (kScheme == Scheme::kBlock) {
    const int groups = cols / kGroup;
    for (int item = warp; item < rows * groups; item += kWarps) {
      const int row = item / groups, group = item % groups;
      if (!row_valid(row)) continue;
      float4* four = reinterpret_cast<float4*>(values + static_cast<long long>(row) * cols + group * kGroup) + lane;
      float4 v = *four;
      const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
      const float scale = quant::fp8_scale(amax, ue8m0);
      v = make_float4(e4m3_value(v.x, scale), e4m3_value(v.y, scale), e4m3_value(v.z, scale), e4m3_value(v.w, scale));
      *four = v;
      if (lane == 0) scales[row * groups + group] = scale;
    }
  } else if constexpr (kScheme == Scheme::kChannel) {
    for (int row = warp; row < rows; row += kWarps) {
      if (!row_valid(row)) continue;
      float* line = values + static_cast<long long>(row) * cols;
      float amax = 0.0f;
      for (int c = lane; c < cols; c += 32) amax = fmaxf(amax, fabsf(line[c]));
      const float scale = quant::fp8_scale(warp_max(amax), ue8m0);
      for (int c = lane; c < cols; c += 32) line[c] = e4m3_value(line[c], scale);
      if (lane == 0) scales[row] = scale;
    }
  } else {
    float scale;
    if (static_scale != nullptr) {
      scale = *static_scale;
    } else {
      float amax = 0.0f;
      for (long long i = threadIdx.x; i < static_cast<long long>(rows) * cols; i += kThreads)
        if (row_valid(static_cast<int>(i / cols))) amax = fmaxf(amax, fabsf(values[i]));
      scale = quant::fp8_scale(block_max(amax, scratch), ue8m0);
    }
    for (long long i = threadIdx.x; i < static_cast<long long>(rows) * cols; i += kThreads)
      if (row_valid(static_cast<int>(i / cols))) values[i] = e4m3_value(values[i], scale);
    if (threadIdx.x == 0) scales[0] = scale;
  }
  __syncthreads();
}

// Routing of token `warp` by the whole warp into ids / weights (k entries each).
template <int kPerLane>
__device__ void route_token(const KernelArgs& a, int token, float* staged_choice, float2* staged_top2, int* ids,
                            float* weights) {
  const long long offset = static_cast<long long>(token) * a.experts;
  if (a.grouped) {
    if (a.logits_bf16)
      routing::grouped_topk_token<kPerLane>(static_cast<const __nv_bfloat16*>(a.logits) + offset, a.correction_bias,
                                            a.experts, a.top_k, a.num_groups, a.topk_groups, a.scaling_factor,
                                            staged_choice, staged_top2, ids, weights);
    else
      routing::grouped_topk_token<kPerLane>(static_cast<const float*>(a.logits) + offset, a.correction_bias, a.experts,
                                            a.top_k, a.num_groups, a.topk_groups, a.scaling_factor, staged_choice,
                                            staged_top2, ids, weights);
  } else if (a.logits_bf16) {
    routing::softmax_topk_token<kPerLane>(static_cast<const __nv_bfloat16*>(a.logits) + offset, a.experts, a.top_k,
                                          a.renormalize, ids, weights);
  } else {
    routing::softmax_topk_token<kPerLane>(static_cast<const float*>(a.logits) + offset, a.experts, a.top_k,
                                          a.renormalize, ids, weights);
  }
}

// kTokens: the largest T the instantiation runs (1, or kMaxTokens).
template <int kPerLane, int kTokens, Scheme kScheme>
__global__ void __launch_bounds__(kThreads, 1) decode_layer_kernel(KernelArgs a) {
  using T = Traits<kScheme>;
  constexpr int kPer = T::kPerVector;
  __shared__ int slot_id[kMaxSlots];
  __shared__ float slot_weight[kMaxSlots];
  __shared__ int slot_token[kMaxSlots];      // GEMM2: the token of each slot
  __shared__ float slot_scale[kMaxSlots];    // GEMM2: routing weight × the slot's activation scale (not per group)
  __shared__ int hit_expert[kMaxSlots];
  __shared__ unsigned hit_slots[kMaxSlots];
  __shared__ int hit_count;
  __shared__ float staged_choice[kTokens][kPerLane * 32];
  __shared__ float2 staged_top2[kTokens][32];
  __shared__ float scratch[kWarps];
  extern __shared__ float4 dynamic_shared[];
  const int tokens = a.num_tokens, top_k = a.top_k, slots = tokens * top_k;
  const int hidden = a.hidden, inter = a.intermediate;
  float* act = reinterpret_cast<float*>(dynamic_shared);
  const float4* act4 = dynamic_shared;
  float* act_scales = act + activation_floats(tokens, top_k, hidden, inter);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // ---- 1. Routing (warps 0..T-1) while the other warps stage x as fp32.
  if (warp < kTokens) {
    if (warp < tokens) {
      if (a.logits != nullptr) {
        route_token<kPerLane>(a, warp, staged_choice[warp], staged_top2[warp], slot_id + warp * top_k,
                              slot_weight + warp * top_k);
      } else {
        for (int s = lane; s < top_k; s += 32) {
          slot_id[warp * top_k + s] = a.topk_ids[warp * top_k + s];
          slot_weight[warp * top_k + s] = a.topk_weights[warp * top_k + s];
        }
      }
    }
  } else {
    const int vectors = tokens * hidden / 8;
    for (int v = threadIdx.x - kTokens * 32; v < vectors; v += kThreads - kTokens * 32) {
      stage_bf16_vector<T::kQuads>(dynamic_shared, v, __ldg(reinterpret_cast<const uint4*>(a.x) + v));
    }
  }
  __syncthreads();

  // ---- 2. Hits: the distinct valid experts in slot order of first use, each with its slot mask.
  if (warp == 0) {
    const int id = lane < slots ? slot_id[lane] : -1;
    const bool valid = lane < slots && id >= 0 && id < a.experts;
    const unsigned same = __match_any_sync(0xffffffffu, valid ? id : -1 - lane);
    const bool leader = valid && (__ffs(same) - 1) == lane;
    const unsigned leaders = __ballot_sync(0xffffffffu, leader);
    if (leader) {
      const int hit = __popc(leaders & ((1u << lane) - 1u));
      hit_expert[hit] = id;
      hit_slots[hit] = same;
    }
    const unsigned invalid = __ballot_sync(0xffffffffu, lane < slots && !valid);
    if (lane == 0) hit_count = __popc(leaders);
    if (blockIdx.x == 0) {
      if (lane == 0 && invalid != 0 && a.invalid_id_count != nullptr) atomicAdd(a.invalid_id_count, __popc(invalid));
      if (a.logits != nullptr && lane < slots) {
        a.routed_ids[lane] = slot_id[lane];
        a.routed_weights[lane] = slot_weight[lane];
      }
    }
  }
  if constexpr (T::kFp8) {
    __syncthreads();
    quantize_rows<kScheme>(act, act_scales, tokens, hidden, a.act_scale, a.ue8m0, [](int) { return true; }, scratch);
  } else {
    __syncthreads();
  }

  const int global_warp = blockIdx.x * kWarps + warp, grid_warps = gridDim.x * kWarps;
  const int hits = hit_count;

  // ---- 3. GEMM1 + SwiGLU: task = (hit, intermediate column j). A warp walks its tasks as one stream
  // of steps (kBatch1 vectors of the gate and the up row each), loading step s + 1 while it computes
  // step s, across task boundaries too.
  {
    const int vectors = hidden / kPer;   // per weight row
    const int hidden_groups = groups_of(hidden);
    const int steps_per_task = (vectors + 32 * kBatch1 - 1) / (32 * kBatch1);
    const int tasks = hits * inter;
    const int my_tasks = global_warp < tasks ? (tasks - global_warp + grid_warps - 1) / grid_warps : 0;
    const int steps = my_tasks * steps_per_task;
    // Weight rows of the task the step belongs to.
    const auto gate_row_of = [&](int task) {
      const int hit = task / inter, j = task - hit * inter;
      return a.w13 + (static_cast<long long>(hit_expert[hit]) * 2 * inter +
                      (j / (gemm::kSwiGluGroupRows / 2)) * gemm::kSwiGluGroupRows + j % (gemm::kSwiGluGroupRows / 2)) *
                         vectors;
    };
    const long long up_offset = static_cast<long long>(gemm::kSwiGluGroupRows / 2) * vectors;
    const auto load_step = [&](int step, uint4 (&gw)[kBatch1], uint4 (&uw)[kBatch1]) {
      const int task = global_warp + (step / steps_per_task) * grid_warps;
      const int base = (step % steps_per_task) * 32 * kBatch1;
      const uint4* gate_w = gate_row_of(task);
      #pragma unroll
      for (int b = 0; b < kBatch1; ++b) {
        const int v = base + b * 32 + lane;
        if (v < vectors) {
          gw[b] = load_streaming(gate_w + v);
          uw[b] = load_streaming(gate_w + up_offset + v);
        }
      }
    };
    uint4 gw[kBatch1], uw[kBatch1];
    if (steps > 0) load_step(0, gw, uw);
    float gate[kTokens] = {}, up[kTokens] = {};
    for (int step = 0; step < steps; ++step) {
      uint4 next_gw[kBatch1], next_uw[kBatch1];
      if (step + 1 < steps) load_step(step + 1, next_gw, next_uw);
      const int task = global_warp + (step / steps_per_task) * grid_warps;
      const int base = (step % steps_per_task) * 32 * kBatch1;
      const int hit = task / inter, j = task - hit * inter;
      const int expert = hit_expert[hit];
      const unsigned mask = hit_slots[hit];
      unsigned token_mask = 0;
      for (unsigned m = mask; m != 0; m &= m - 1) token_mask |= 1u << ((__ffs(m) - 1) / top_k);
      const float* gate_block_scale = nullptr;
      const float* up_block_scale = nullptr;
      if constexpr (kScheme == Scheme::kBlock) {
        const int row_blocks = groups_of(2 * inter);
        gate_block_scale = a.w13_scale + (static_cast<long long>(expert) * row_blocks + j / kGroup) * hidden_groups;
        up_block_scale = a.w13_scale + (static_cast<long long>(expert) * row_blocks + (inter + j) / kGroup) * hidden_groups;
      }
      #pragma unroll
      for (int b = 0; b < kBatch1; ++b) {
        const int v = base + b * 32 + lane;
        if (v >= vectors) break;
        const int col = v * kPer;
        float gate_scale = 1.0f, up_scale = 1.0f;
        if constexpr (kScheme == Scheme::kBlock) {
          gate_scale = __ldg(gate_block_scale + col / kGroup);
          up_scale = __ldg(up_block_scale + col / kGroup);
        }
        #pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          if (!((token_mask >> t) & 1u)) continue;
          const long long quad = (static_cast<long long>(t) * hidden + col) / 4;
          float x_scale = 1.0f;
          if constexpr (kScheme == Scheme::kBlock) x_scale = act_scales[t * hidden_groups + col / kGroup];
          gate[t] = fmaf(dot_vector(gw[b], act4, quad, T{}), gate_scale * x_scale, gate[t]);
          up[t] = fmaf(dot_vector(uw[b], act4, quad, T{}), up_scale * x_scale, up[t]);
        }
      }
      if (step % steps_per_task == steps_per_task - 1) {   // the task's last step: SwiGLU, store, reset
        #pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          if (!((token_mask >> t) & 1u)) continue;
          float g = warp_sum(gate[t]), u = warp_sum(up[t]);
          gate[t] = up[t] = 0.0f;
          if (lane != 0) continue;
          if constexpr (kScheme == Scheme::kChannel) {
            g *= __ldg(a.w13_scale + static_cast<long long>(expert) * 2 * inter + j) * act_scales[t];
            u *= __ldg(a.w13_scale + static_cast<long long>(expert) * 2 * inter + inter + j) * act_scales[t];
          } else if constexpr (kScheme == Scheme::kTensor) {
            const float scale = __ldg(a.w13_scale + expert) * act_scales[0];
            g *= scale;
            u *= scale;
          }
          const __nv_bfloat16 h = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
          for (unsigned m = mask; m != 0; m &= m - 1) {
            const int s = __ffs(m) - 1;
            if (s / top_k == t) a.swiglu[static_cast<long long>(s) * inter + j] = h;
          }
        }
      }
      #pragma unroll
      for (int b = 0; b < kBatch1; ++b) {
        gw[b] = next_gw[b];
        uw[b] = next_uw[b];
      }
    }
  }

  // ---- 4. Every CTA's SwiGLU output is written and visible.
  cooperative_groups::this_grid().sync();

  // ---- 5. The SwiGLU output of the valid slots into shared memory (FP8: re-quantised).
  unsigned valid_slots = 0;
  for (int h = 0; h < hits; ++h) valid_slots |= hit_slots[h];
  {
    const int vectors = slots * inter / 8;
    for (int v = threadIdx.x; v < vectors; v += kThreads) {
      const int s = v * 8 / inter;
      if (!((valid_slots >> s) & 1u)) continue;
      stage_bf16_vector<T::kQuads>(dynamic_shared, v, __ldcg(reinterpret_cast<const uint4*>(a.swiglu) + v));
    }
  }
  __syncthreads();
  if constexpr (T::kFp8)
    quantize_rows<kScheme>(act, act_scales, slots, inter, a.intermediate_act_scale, a.ue8m0,
                           [valid_slots](int s) { return ((valid_slots >> s) & 1u) != 0; }, scratch);
  if (threadIdx.x < slots) {
    const int s = threadIdx.x;
    float scale = slot_weight[s];
    if constexpr (kScheme == Scheme::kChannel) scale *= act_scales[s];
    else if constexpr (kScheme == Scheme::kTensor) scale *= act_scales[0];
    slot_token[s] = s / top_k;
    slot_scale[s] = scale;
  }
  __syncthreads();

  // ---- 6. GEMM2 × routing weight + combine: task = output column n of every token; its steps are
  // kBatch2 vectors of the hits' w2 rows n, pipelined as in GEMM1. Each lane's vector (hit, v) is
  // tracked by stepping, not dividing; each slot's token and scale come from shared tables.
  {
    const int vectors = inter / kPer;   // per w2 row
    const int inter_groups = groups_of(inter);
    const int per_task = hits * vectors;
    const int steps_per_task = (per_task + 32 * kBatch2 - 1) / (32 * kBatch2);
    const int my_tasks = global_warp < hidden ? (hidden - global_warp + grid_warps - 1) / grid_warps : 0;
    const int steps = per_task > 0 ? my_tasks * steps_per_task : 0;
    // The hit and vector of index base + lane (then + 32 per batch entry).
    const auto first_vector = [&](int base, int& hit, int& v) {
      hit = (base + lane) / vectors;
      v = base + lane - hit * vectors;
    };
    const auto next_vector = [&](int& hit, int& v) {
      v += 32;
      while (v >= vectors) {
        v -= vectors;
        ++hit;
      }
    };
    const auto load_step = [&](int step, uint4 (&w)[kBatch2]) {
      const int n = global_warp + (step / steps_per_task) * grid_warps;
      int hit, v;
      first_vector((step % steps_per_task) * 32 * kBatch2, hit, v);
      #pragma unroll
      for (int b = 0; b < kBatch2; ++b) {
        if (hit < hits) w[b] = load_streaming(a.w2 + (static_cast<long long>(hit_expert[hit]) * hidden + n) * vectors + v);
        next_vector(hit, v);
      }
    };
    uint4 w[kBatch2];
    if (steps > 0) load_step(0, w);
    float acc[kTokens] = {};
    for (int step = 0; step < steps; ++step) {
      uint4 next[kBatch2];
      if (step + 1 < steps) load_step(step + 1, next);
      const int n = global_warp + (step / steps_per_task) * grid_warps;
      int hit, v;
      first_vector((step % steps_per_task) * 32 * kBatch2, hit, v);
      #pragma unroll
      for (int b = 0; b < kBatch2; ++b) {
        if (hit >= hits) break;
        const int expert = hit_expert[hit], col = v * kPer;
        float weight_scale = 1.0f;
        if constexpr (kScheme == Scheme::kBlock)
          weight_scale = __ldg(a.w2_scale + (static_cast<long long>(expert) * groups_of(hidden) + n / kGroup) *
                                                inter_groups + col / kGroup);
        else if constexpr (kScheme == Scheme::kChannel)
          weight_scale = __ldg(a.w2_scale + static_cast<long long>(expert) * hidden + n);
        else if constexpr (kScheme == Scheme::kTensor)
          weight_scale = __ldg(a.w2_scale + expert);
        for (unsigned m = hit_slots[hit]; m != 0; m &= m - 1) {
          const int s = __ffs(m) - 1;
          float scale = slot_scale[s] * weight_scale;
          if constexpr (kScheme == Scheme::kBlock) scale *= act_scales[s * inter_groups + col / kGroup];
          const float d = dot_vector(w[b], act4, (static_cast<long long>(s) * inter + col) / 4, T{}) * scale;
          if constexpr (kTokens == 1) {
            acc[0] += d;
          } else {
            const int t = slot_token[s];
            #pragma unroll
            for (int u = 0; u < kTokens; ++u)
              if (u == t) acc[u] += d;
          }
        }
        next_vector(hit, v);
      }
      if (step % steps_per_task == steps_per_task - 1) {   // the column's last step: sum lanes, store
        #pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          if (t >= tokens) break;
          const float sum = warp_sum(acc[t]);
          acc[t] = 0.0f;
          if (lane == 0) a.out[static_cast<long long>(t) * hidden + n] = __float2bfloat16(sum);
        }
      }
      #pragma unroll
      for (int b = 0; b < kBatch2; ++b) w[b] = next[b];
    }
    if (per_task == 0) {   // no valid slot at all: every output is zero
      for (int n = global_warp; n < hidden; n += grid_warps)
        if (lane < tokens) a.out[static_cast<long long>(lane) * hidden + n] = __float2bfloat16(0.0f);
    }
  }
}

// Host side, per scheme (decode_bf16.cu, decode_fp8.cu): launch or, with launch == nullptr, prepare.
template <Scheme kScheme>
void launch_scheme(const KernelArgs* args, int per_lane, int num_sms, std::size_t shared_bytes, cudaStream_t stream);

}  // namespace hmoe::decode
