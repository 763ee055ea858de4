// FP8 activation quantisation. 1×128 groups: 4 elements per thread per step (8-byte bf16 loads,
// 4-byte e4m3 stores); a group is exactly one warp's step, each warp takes kGroupsPerWarp consecutive
// groups with their loads issued together, and a row spans as many blocks as it needs (blockIdx.y).
// Per-row and per-tensor scales: one block per row, or one warp per row when the row is narrow
// (rows_per_block); per row 4 elements a thread a step, per token (prefill's x) 8 (16-byte loads,
// 8-byte stores to each of the token's rows) with kBatch steps' loads issued together.
// NOTE: a row walked by one block in dependent steps made T = 1 latency-bound: deepseek-v3's x
// (8 rows of 7168, 14 steps per warp) took 10.2 µs, measured on H200 (docs/PERF.md, "Decode chain v1").
#include "quant/activations.hpp"

#include <cuda_bf16.h>

#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/launch.cuh"
#include "quant/divide.hpp"
#include "quant/fp8.cuh"

namespace hmoe::quant {
namespace {

enum class Granularity { kGroup128, kRow, kTensor };

constexpr int kThreads = 128;
constexpr int kGroup = 128;
constexpr int kGroupsPerWarp = 4;
constexpr int kWarps = kThreads / 32;
constexpr int kGroupsPerBlock = kGroupsPerWarp * kWarps;
constexpr int kStep = 8;    // per token and the amax pass: elements a thread loads at once (16 bytes of bf16)
constexpr int kBatch = 4;   // per token and the amax pass: steps whose loads a thread issues together
constexpr int kWarpRowCols = kBatch * kStep * 32;   // per-row / per-tensor rows a warp walks alone (one batch per token)

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

// The e4m3 bytes of two quotients (value / scale, rounded as to_e4m3 does), the first in the lower byte.
__device__ __forceinline__ std::uint32_t pack_pair(float first, float second) {
  return static_cast<std::uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(first, second), __NV_SATFINITE, __NV_E4M3));
}

// The e4m3 bytes of four quotients, the first in the lowest byte.
__device__ __forceinline__ std::uint32_t pack_quotients(const Four& quotient) {
  return pack_pair(quotient.v[0], quotient.v[1]) | (pack_pair(quotient.v[2], quotient.v[3]) << 16);
}

struct Eight {
  float v[kStep];
};

__device__ __forceinline__ Eight load_eight(const __nv_bfloat16* source) {
  const uint4 bits = *reinterpret_cast<const uint4*>(source);
  const std::uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
  Eight eight;
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(&words[i]);
    eight.v[2 * i] = __low2float(pair);
    eight.v[2 * i + 1] = __high2float(pair);
  }
  return eight;
}

__device__ __forceinline__ float max_abs(const Eight& eight) {
  float result = 0.0f;
  #pragma unroll
  for (int i = 0; i < kStep; ++i) result = fmaxf(result, fabsf(eight.v[i]));
  return result;
}

// The e4m3 bytes of eight quotients, the first in the lowest byte.
__device__ __forceinline__ uint2 pack_eight(const float (&quotient)[kStep]) {
  std::uint32_t word[2];
  #pragma unroll
  for (int w = 0; w < 2; ++w)
    word[w] = pack_pair(quotient[4 * w], quotient[4 * w + 1]) | (pack_pair(quotient[4 * w + 2], quotient[4 * w + 3]) << 16);
  return make_uint2(word[0], word[1]);
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
// no row), or with values_by_token its values to row x and only its scales to those rows. A row's values
// and scales depend only on its source row, so all of them write the same bytes.
template <Granularity kGranularity, bool kPerToken>
__global__ void __launch_bounds__(kThreads) quantize_kernel(
    const __nv_bfloat16* __restrict__ source, const int* __restrict__ source_row, const int* __restrict__ num_rows,
    const int* __restrict__ slot_rows, int top_k, int tokens, bool values_by_token, int cols, bool ue8m0,
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
    // values_by_token: every valid target row's store goes to the token's own row instead (the same
    // bytes each time; a token none of whose ids is valid is never read).
    for (int t = 0; t < targets; ++t) {
      const int row = target(t);
      if (row < 0) continue;
      std::uint8_t* out = values + (kPerToken && values_by_token ? from : static_cast<long long>(row)) * cols;
      #pragma unroll
      for (int g = 0; g < kGroupsPerWarp; ++g) {
        if (first + g >= groups) break;
        *reinterpret_cast<std::uint32_t*>(out + (first + g) * kGroup + 4 * lane) = packed[g];
        if (lane == 0) scales[static_cast<long long>(row) * groups + first + g] = scale[g];
      }
    }
  } else if constexpr (!kPerToken) {
    // Per row (decode's x rows, the intermediate's re-quantisation): the row's threads, the whole block
    // or its one warp, take 4 values a step. NOTE: the batched walk below measured 6-8 µs slower for
    // qwen3-30b-a3b's intermediate (I = 768, a warp a row) at T = 4096 (H100, docs/PERF.md, twenty-ninth
    // session): a quarter of its divisions fell past the row's end, and its registers cost occupancy.
    const int thread = block_rows == 1 ? static_cast<int>(threadIdx.x) : lane;
    const int stride = 4 * (block_rows == 1 ? kThreads : 32);
    float scale;
    if constexpr (kGranularity == Granularity::kRow) {
      float amax = 0.0f;
      #pragma unroll 4
      for (int column = 4 * thread; column < cols; column += stride) amax = fmaxf(amax, max_abs(load_four(in + column)));
      scale = fp8_scale(block_rows == 1 ? block_max(amax) : warp_max(amax), ue8m0);
      if (thread == 0) scales[row] = scale;
    } else {
      scale = static_scale != nullptr ? *static_scale : fp8_scale(scales[1], ue8m0);
      if (row == 0 && thread == 0) scales[0] = scale;
    }
    const StaticDivisor divisor = make_static_divisor(scale);
    #pragma unroll 4
    for (int column = 4 * thread; column < cols; column += stride) {
      Four four = load_four(in + column);
      divide_static_rn(four.v, divisor);
      *reinterpret_cast<std::uint32_t*>(values + static_cast<long long>(row) * cols + column) = pack_quotients(four);
    }
  } else {
    // Per token (prefill's x rows, each written to its top_k rows): the row's threads, the whole block
    // or its one warp, walk it in batches of kBatch steps of kStep values a thread, the batch's loads
    // issued before any is used; `base` is warp-uniform, so every lane takes the shuffles below (lanes
    // past the row's end only skip their loads and stores). NOTE: one 8-byte step at a time, with each
    // target row re-read from slot_rows before each store, qwen3-30b-a3b fp8-tensor's x took 6 µs more
    // at T = 4096 (H100, docs/PERF.md, twenty-ninth session).
    const int thread = block_rows == 1 ? static_cast<int>(threadIdx.x) : lane;
    const int stride = kStep * (block_rows == 1 ? kThreads : 32);
    const auto load_batch = [&](int base, Eight (&eight)[kBatch]) {
      #pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int column = base + b * stride + kStep * thread;
        eight[b] = column < cols ? load_eight(in + column) : Eight{};
      }
    };
    float scale;
    if constexpr (kGranularity == Granularity::kRow) {
      float amax = 0.0f;
      for (int base = 0; base < cols; base += kBatch * stride) {
        Eight eight[kBatch];
        load_batch(base, eight);
        #pragma unroll
        for (int b = 0; b < kBatch; ++b) amax = fmaxf(amax, max_abs(eight[b]));   // (zeros past the row's end)
      }
      scale = fp8_scale(block_rows == 1 ? block_max(amax) : warp_max(amax), ue8m0);
    } else {
      scale = static_scale != nullptr ? *static_scale : fp8_scale(scales[1], ue8m0);
      if (row == 0 && thread == 0) scales[0] = scale;
    }
    // Lane t of each warp holds the token's t-th target row (−1: none).
    const int my_target = lane < top_k ? slot_rows[from * top_k + lane] : -1;
    if (kGranularity == Granularity::kRow && thread < 32 && my_target >= 0) scales[my_target] = scale;
    for (int base = 0; base < cols; base += kBatch * stride) {
      Eight eight[kBatch];
      load_batch(base, eight);
      uint2 packed[kBatch];
      #pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        #pragma unroll
        for (int i = 0; i < kStep; ++i) eight[b].v[i] = __fdiv_rn(eight[b].v[i], scale);
        packed[b] = pack_eight(eight[b].v);
      }
      // values_by_token: one store, to the token's own row.
      for (int t = 0; t < (values_by_token ? 1 : targets); ++t) {
        const int target_row = values_by_token ? static_cast<int>(from) : __shfl_sync(0xffffffffu, my_target, t);
        if (target_row < 0) continue;
        std::uint8_t* out = values + static_cast<long long>(target_row) * cols;
        #pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int column = base + b * stride + kStep * thread;
          if (column < cols) *reinterpret_cast<uint2*>(out + column) = packed[b];
        }
      }
    }
  }
}

// amax over rows [0, rows) of a contiguous bf16 matrix (rows = fixed_rows, or *num_rows when
// fixed_rows is 0) into *amax, which the caller zeroed. cols % 8 == 0 and a 16-byte aligned source:
// each thread loads kBatch steps of kStep values at a time, the loads issued together.
// NOTE: with one 8-byte load in flight a thread (the loop was not unrolled, SASS), x's amax pass
// kept too few bytes in flight to stream at DRAM speed (docs/PERF.md, twenty-ninth session).
__global__ void __launch_bounds__(kThreads) amax_kernel(const __nv_bfloat16* __restrict__ source, int fixed_rows,
                                                        const int* __restrict__ num_rows, int cols, float* amax) {
  pdl_start();
  const long long rows = fixed_rows > 0 ? fixed_rows : *num_rows;
  const long long steps = rows * cols / kStep;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  float local = 0.0f;
  for (long long first = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; first < steps;
       first += kBatch * stride) {
    Eight eight[kBatch];
    #pragma unroll
    for (int b = 0; b < kBatch; ++b) eight[b] = first + b * stride < steps ? load_eight(source + kStep * (first + b * stride)) : Eight{};
    #pragma unroll
    for (int b = 0; b < kBatch; ++b) local = fmaxf(local, max_abs(eight[b]));
  }
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
                rows.top_k, rows.tokens, rows.values_by_token, rows.cols, ue8m0, static_scale, out, scales);
}

}  // namespace

void launch_quantize_rows(const MoeSpec& spec, const ActivationRows& rows, const float* static_scale, void* values,
                          float* scales, cudaStream_t stream, bool pdl) {
  auto* out = static_cast<std::uint8_t*>(values);
  const bool ue8m0 = spec.ue8m0_scales;
  // The per-row walk stops at the device row count; token-ordered values are a per-token walk's.
  if (rows.slot_rows == nullptr && rows.num_rows == nullptr)
    throw Error("hmoe: internal error: per-row FP8 quantisation without a device row count (ActivationRows::num_rows)");
  if (rows.values_by_token && rows.slot_rows == nullptr)
    throw Error("hmoe: internal error: ActivationRows::values_by_token needs the per-token walk (slot_rows)");
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
        // One batch a thread at least; 1056 blocks (8 an SM of 132) at most, each thread then looping.
        const long long max_steps = static_cast<long long>(rows.amax_rows > 0 ? rows.amax_rows : rows.max_rows) * rows.cols / kStep;
        const long long per_block = static_cast<long long>(kThreads) * kBatch;
        const int blocks = static_cast<int>(std::clamp<long long>((max_steps + per_block - 1) / per_block, 1, 1056));
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
