// Un-permute and sum over k: one block per token, 8 bf16 (16 bytes) per thread per step, fp32 sums
// in a fixed slot order so results are deterministic.
#include <cuda_bf16.h>

#include "combine/combine.hpp"
#include "common/cuda_check.hpp"

namespace hmoe::combine {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) combine_kernel(const uint4* __restrict__ y,
                                                          const int* __restrict__ slot_rows, int top_k,
                                                          int vectors_per_row, uint4* __restrict__ out) {
  const int token = blockIdx.x;
  const int* slots = slot_rows + static_cast<long long>(token) * top_k;
  for (int v = threadIdx.x; v < vectors_per_row; v += kThreads) {
    float sum[8] = {};
    for (int j = 0; j < top_k; ++j) {
      const int row = slots[j];
      if (row < 0) continue;
      const uint4 packed = y[static_cast<long long>(row) * vectors_per_row + v];
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
      #pragma unroll
      for (int p = 0; p < 4; ++p) {
        const float2 value = __bfloat1622float2(pairs[p]);
        sum[2 * p] += value.x;
        sum[2 * p + 1] += value.y;
      }
    }
    uint4 packed;
    __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
    #pragma unroll
    for (int p = 0; p < 4; ++p) pairs[p] = __floats2bfloat162_rn(sum[2 * p], sum[2 * p + 1]);
    out[static_cast<long long>(token) * vectors_per_row + v] = packed;
  }
}

}  // namespace

void launch_combine(const void* y, const int* slot_rows, int num_tokens, int top_k, int hidden, void* out,
                    cudaStream_t stream) {
  combine_kernel<<<num_tokens, kThreads, 0, stream>>>(static_cast<const uint4*>(y), slot_rows, top_k, hidden / 8,
                                                      static_cast<uint4*>(out));
  HMOE_CUDA_CHECK(cudaGetLastError());
}

void prepare() {
  cudaFuncAttributes attributes;
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, combine_kernel));
}

}  // namespace hmoe::combine
