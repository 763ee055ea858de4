// Un-permute and sum over k: one thread per 8 bf16 (16 bytes) of a token's row, a block row of
// kThreads of them per token; fp32 sums in a fixed slot order so results are deterministic.
// NOTE: every thread issues its slots' loads before it adds (up to kSlotsInFlight at once). A loop
// of dependent steps per thread made T = 1 latency-bound: deepseek-v3 (H = 7168, one block, 3.5
// steps of 8 loads each) spent 8.9 µs here, measured on H200 (docs/PERF.md, "Decode chain v1").
#include <cuda_bf16.h>

#include "combine/combine.hpp"
#include "common/cuda_check.hpp"
#include "common/launch.cuh"

namespace hmoe::combine {
namespace {

constexpr int kThreads = 128;
constexpr int kSlotsInFlight = 8;

__global__ void __launch_bounds__(kThreads) combine_kernel(const uint4* __restrict__ y,
                                                          const int* __restrict__ slot_rows, int top_k,
                                                          int vectors_per_row, uint4* __restrict__ out) {
  pdl_start();
  const int token = blockIdx.x;
  const int v = blockIdx.y * kThreads + threadIdx.x;
  if (v >= vectors_per_row) return;
  const int* slots = slot_rows + static_cast<long long>(token) * top_k;
  float sum[8] = {};
  for (int first = 0; first < top_k; first += kSlotsInFlight) {
    uint4 packed[kSlotsInFlight];
    bool present[kSlotsInFlight];
    #pragma unroll
    for (int j = 0; j < kSlotsInFlight; ++j) {
      const int row = first + j < top_k ? slots[first + j] : -1;
      present[j] = row >= 0;
      if (present[j]) packed[j] = y[static_cast<long long>(row) * vectors_per_row + v];
    }
    #pragma unroll
    for (int j = 0; j < kSlotsInFlight; ++j) {
      if (!present[j]) continue;
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed[j]);
      #pragma unroll
      for (int p = 0; p < 4; ++p) {
        const float2 value = __bfloat1622float2(pairs[p]);
        sum[2 * p] += value.x;
        sum[2 * p + 1] += value.y;
      }
    }
  }
  uint4 result;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&result);
  #pragma unroll
  for (int p = 0; p < 4; ++p) pairs[p] = __floats2bfloat162_rn(sum[2 * p], sum[2 * p + 1]);
  out[static_cast<long long>(token) * vectors_per_row + v] = result;
}

}  // namespace

void launch_combine(const void* y, const int* slot_rows, int num_tokens, int top_k, int hidden, void* out,
                    cudaStream_t stream, bool pdl) {
  if (num_tokens == 0) return;
  const int vectors_per_row = hidden / 8;
  const dim3 grid(num_tokens, (vectors_per_row + kThreads - 1) / kThreads);
  launch_kernel(pdl, combine_kernel, grid, kThreads, 0, stream, static_cast<const uint4*>(y), slot_rows, top_k,
                vectors_per_row, static_cast<uint4*>(out));
}

void prepare() {
  cudaFuncAttributes attributes;
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, combine_kernel));
}

}  // namespace hmoe::combine
