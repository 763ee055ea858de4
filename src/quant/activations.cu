// FP8 activation quantisation: 4 elements per thread per step (8-byte bf16 loads, 4-byte e4m3
// stores). 1×128 groups: a group is exactly one warp's step, each warp takes kGroupsPerWarp
// consecutive groups with their loads issued together, and a row spans as many blocks as it needs
// (blockIdx.y). Per-row and per-tensor scales: one block per row. Narrow rows share a block
// (rows_per_block): a row of at most four groups is one warp's, and a per-row or per-tensor row of at
// most kWarpRowCols columns is one warp's too.
// NOTE: a row walked by one block in dependent steps made T = 1 latency-bound: deepseek-v3's x
// (8 rows of 7168, 14 steps per warp) took 10.2 µs, measured on H200 (docs/PERF.md, "Decode chain v1").
#include "quant/activations.hpp"

#include <cuda_bf16.h>

#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/launch.cuh"
#include "quant/fp8.cuh"

namespace hmoe::quant {
namespace {

enum class Granularity { kGroup128, kRow, kTensor };

constexpr int kThreads = 128;
constexpr int kGroup = 128;
constexpr int kGroupsPerWarp = 4;
constexpr int kWarps = kThreads / 32;
constexpr int kGroupsPerBlock = kGroupsPerWarp * kWarps;
constexpr int kWarpRowCols = 8 * 4 * 32;   // per-row / per-tensor rows a warp walks alone: 8 steps a lane

// Rows one block quantises: a row takes ⌈groups / kGroupsPerWarp⌉ warps (1×128 groups; all kWarps
// beyond that, with blockIdx.y walking the rest), or one warp when narrow enough (per row, per tensor).
// NOTE: with one block per row a narrow row kept one warp of four busy for two loads (deepseek-v3-tp8's
// intermediate, I = 256: 65536 blocks at T = 8192), and the pass ran at ~4× its bytes' time; rows sharing
// a block took deepseek-v3-tp8 fp8-block T = 8192 and qwen3-235b-a22b-tp4 T = 4096 2.4 / 2.3 % faster
// with the separate pass (H100, docs/PERF.md twenty-sixth session).
__host__ __device__ constexpr int rows_per_block(Granularity granularity, int cols) {
  if (granularity == Granularity::kGroup128) {
    const int warps = (cols / kGroup + kGroupsPerWarp - 1) / kGroupsPerWarp;
    return warps >= 1 && warps <= kWarps ? kWarps / warps : 1;
  }
  return cols <= kWarpRowCols ? kWarps : 1;
}

struct Four {
  float v[4];
};

__device__ __forceinline__ Four load_four(const __nv_bfloat16* source) {
  const uint2 bits = *reinterpret_cast<const uint2*>(source);
  const __nv_bfloat162 low = *reinterpret_cast<const __nv_bfloat162*>(&bits.x);
  const __nv_bfloat162 high = *reinterpret_cast<const __nv_bfloat162*>(&bits.y);
  return Four{{__low2float(low), __high2float(low), __low2float(high), __high2float(high)}};
}

__device__ __forceinline__ float max_abs(const Four& four) {
  return fmaxf(fmaxf(fabsf(four.v[0]), fabsf(four.v[1])), fmaxf(fabsf(four.v[2]), fabsf(four.v[3])));
}

__device__ __forceinline__ std::uint32_t pack_four(const Four& four, float scale) {
  return to_e4m3(four.v[0], scale) | (to_e4m3(four.v[1], scale) << 8) | (to_e4m3(four.v[2], scale) << 16) |
         (static_cast<std::uint32_t>(to_e4m3(four.v[3], scale)) << 24);
}

__device__ __forceinline__ float warp_max(float value) {
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Largest value over the block (every thread gets it).
__device__ float block_max(float value) {
  __shared__ float partial[kThreads / 32];
  value = warp_max(value);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
  __syncthreads();
  float result = partial[0];
  #pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) result = fmaxf(result, partial[w]);
  return result;
}

// Each block quantises rows_per_block(cols) rows (× column blocks for 1×128 groups) and writes the e4m3
// values and scales to their target rows; the row's warps (all of them when one row a block) work on
// it. Per row (kPerToken false): row x is sorted row x (rows past *num_rows return), reading source
// row source_row[x] (or x) — a token's x row is read once per sorted row. Per token (prefill): row x
// is token x (x < tokens), read once, written to its top_k rows slot_rows[x·k + s] (−1: an invalid id,
// no row). A row's values and scales depend only on its source row, so both write the same bytes.
template <Granularity kGranularity, bool kPerToken>
__global__ void __launch_bounds__(kThreads) quantize_kernel(
    const __nv_bfloat16* __restrict__ source, const int* __restrict__ source_row, const int* __restrict__ num_rows,
    const int* __restrict__ slot_rows, int top_k, int tokens, int cols, bool ue8m0,
    const float* __restrict__ static_scale, std::uint8_t* __restrict__ values, float* __restrict__ scales) {
  pdl_start();
  const int block_rows = rows_per_block(kGranularity, cols), row_warps = kWarps / block_rows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Warp-uniform (block-uniform when one row a block, where block_max synchronises the block).
  const int row = static_cast<int>(blockIdx.x) * block_rows + warp / row_warps;
  long long from = row;
  if constexpr (!kPerToken) {
    if (row >= *num_rows) return;
    if (source_row != nullptr) from = source_row[row];
  } else {
    if (row >= tokens) return;
  }
  const __nv_bfloat16* in = source + from * cols;
  const int targets = kPerToken ? top_k : 1;
  // The t-th target row (−1: none).
  const auto target = [&](int t) { return kPerToken ? slot_rows[from * top_k + t] : row; };
  if constexpr (kGranularity == Granularity::kGroup128) {
    const int groups = cols / kGroup;
    const int first = blockIdx.y * kGroupsPerBlock + warp % row_warps * kGroupsPerWarp;
    Four four[kGroupsPerWarp];
    #pragma unroll
    for (int g = 0; g < kGroupsPerWarp; ++g)
      if (first + g < groups) four[g] = load_four(in + (first + g) * kGroup + 4 * lane);
    std::uint32_t packed[kGroupsPerWarp];
    float scale[kGroupsPerWarp];
    #pragma unroll
    for (int g = 0; g < kGroupsPerWarp; ++g) {
      if (first + g >= groups) break;   // warp-uniform: the shuffles below see the whole warp
      scale[g] = fp8_scale(warp_max(max_abs(four[g])), ue8m0);
      packed[g] = pack_four(four[g], scale[g]);
    }
    for (int t = 0; t < targets; ++t) {
      const int row = target(t);
      if (row < 0) continue;
      std::uint8_t* out = values + static_cast<long long>(row) * cols;
      #pragma unroll
      for (int g = 0; g < kGroupsPerWarp; ++g) {
        if (first + g >= groups) break;
        *reinterpret_cast<std::uint32_t*>(out + (first + g) * kGroup + 4 * lane) = packed[g];
        if (lane == 0) scales[static_cast<long long>(row) * groups + first + g] = scale[g];
      }
    }
  } else {
    // A row's threads: the whole block, or its one warp.
    const int thread = block_rows == 1 ? static_cast<int>(threadIdx.x) : lane;
    const int stride = 4 * (block_rows == 1 ? kThreads : 32);
    float scale;
    if constexpr (kGranularity == Granularity::kRow) {
      float amax = 0.0f;
      #pragma unroll 4
      for (int column = 4 * thread; column < cols; column += stride) amax = fmaxf(amax, max_abs(load_four(in + column)));
      scale = fp8_scale(block_rows == 1 ? block_max(amax) : warp_max(amax), ue8m0);
      if (thread == 0)
        for (int t = 0; t < targets; ++t)
          if (target(t) >= 0) scales[target(t)] = scale;
    } else {
      scale = static_scale != nullptr ? *static_scale : fp8_scale(scales[1], ue8m0);
      if (row == 0 && thread == 0) scales[0] = scale;
    }
    #pragma unroll 4
    for (int column = 4 * thread; column < cols; column += stride) {
      const std::uint32_t packed = pack_four(load_four(in + column), scale);
      for (int t = 0; t < targets; ++t)
        if (target(t) >= 0) *reinterpret_cast<std::uint32_t*>(values + static_cast<long long>(target(t)) * cols + column) = packed;
    }
  }
}

// amax over rows [0, rows) of a contiguous bf16 matrix (rows = fixed_rows, or *num_rows when
// fixed_rows is 0) into *amax, which the caller zeroed.
__global__ void __launch_bounds__(kThreads) amax_kernel(const __nv_bfloat16* __restrict__ source, int fixed_rows,
                                                        const int* __restrict__ num_rows, int cols, float* amax) {
  pdl_start();
  const long long rows = fixed_rows > 0 ? fixed_rows : *num_rows;
  const long long quads = rows * cols / 4;
  float local = 0.0f;
  for (long long q = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; q < quads;
       q += static_cast<long long>(gridDim.x) * kThreads)
    local = fmaxf(local, max_abs(load_four(source + 4 * q)));
  local = block_max(local);
  if (threadIdx.x == 0 && local > 0.0f) atomic_max_abs(amax, local);
}

// quantize_kernel<kGranularity> per row or per token, as rows.slot_rows says.
template <Granularity kGranularity>
void launch_quantize(const ActivationRows& rows, int grid_rows, bool ue8m0, const float* static_scale,
                     std::uint8_t* out, float* scales, cudaStream_t stream, bool pdl) {
  const auto* source = static_cast<const __nv_bfloat16*>(rows.source);
  const auto kernel = rows.slot_rows != nullptr ? quantize_kernel<kGranularity, true> : quantize_kernel<kGranularity, false>;
  const int block_rows = rows_per_block(kGranularity, rows.cols);
  const dim3 grid((grid_rows + block_rows - 1) / block_rows,
                  kGranularity == Granularity::kGroup128 ? (rows.cols / kGroup + kGroupsPerBlock - 1) / kGroupsPerBlock : 1);
  launch_kernel(pdl, kernel, grid, kThreads, 0, stream, source, rows.source_row, rows.num_rows, rows.slot_rows,
                rows.top_k, rows.tokens, rows.cols, ue8m0, static_scale, out, scales);
}

}  // namespace

void launch_quantize_rows(const MoeSpec& spec, const ActivationRows& rows, const float* static_scale, void* values,
                          float* scales, cudaStream_t stream, bool pdl) {
  auto* out = static_cast<std::uint8_t*>(values);
  const bool ue8m0 = spec.ue8m0_scales;
  const int grid_rows = rows.slot_rows != nullptr ? rows.tokens : rows.max_rows;
  if (grid_rows <= 0) return;
  switch (spec.scheme) {
    case QuantScheme::kBlock128:
      launch_quantize<Granularity::kGroup128>(rows, grid_rows, ue8m0, nullptr, out, scales, stream, pdl);
      break;
    case QuantScheme::kPerChannelPerToken:
      launch_quantize<Granularity::kRow>(rows, grid_rows, ue8m0, nullptr, out, scales, stream, pdl);
      break;
    case QuantScheme::kPerTensor:
      if (static_scale == nullptr && !rows.amax_ready) {
        if (!rows.amax_zeroed) HMOE_CUDA_CHECK(cudaMemsetAsync(scales + 1, 0, sizeof(float), stream));
        const long long max_quads = static_cast<long long>(rows.amax_rows > 0 ? rows.amax_rows : rows.max_rows) * rows.cols / 4;
        const int blocks = static_cast<int>(std::clamp<long long>((max_quads + kThreads * 8 - 1) / (kThreads * 8), 1, 1056));
        launch_kernel(pdl, amax_kernel, blocks, kThreads, 0, stream, static_cast<const __nv_bfloat16*>(rows.source),
                      rows.amax_rows, rows.num_rows, rows.cols, scales + 1);
      }
      launch_quantize<Granularity::kTensor>(rows, grid_rows, ue8m0, static_scale, out, scales, stream, pdl);
      break;
    case QuantScheme::kNone:
      throw Error("hmoe: internal error: FP8 quantisation requested for a bf16 layer");
  }
}

void prepare() {
  cudaFuncAttributes attributes;
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, quantize_kernel<Granularity::kGroup128, false>));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, quantize_kernel<Granularity::kGroup128, true>));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, quantize_kernel<Granularity::kRow, false>));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, quantize_kernel<Granularity::kRow, true>));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, quantize_kernel<Granularity::kTensor, false>));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, quantize_kernel<Granularity::kTensor, true>));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, amax_kernel));
}

}  // namespace hmoe::quant
