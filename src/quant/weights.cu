// quantize_weights: bf16 expert weights → e4m3 values and scales in the checkpoint layouts, for
// users who start from BF16. One-time work: three passes (amax per group, scales, values).
#include <cuda_bf16.h>

#include <string>

#include "common/cuda_check.hpp"
#include "hmoe/hmoe.hpp"
#include "quant/fp8.cuh"

namespace hmoe {
namespace {

constexpr int kThreads = 128;
constexpr int kBlock = 128;

struct MatrixShape {
  int experts, rows, cols;
};

MatrixShape shape_of(const MoeSpec& spec, WeightMatrix matrix) {
  if (matrix == WeightMatrix::kW13) return {spec.num_experts, 2 * spec.intermediate, spec.hidden};
  return {spec.num_experts, spec.hidden, spec.intermediate};
}

// The scale group of element (expert, row, col) under scheme.
__device__ __forceinline__ long long group_of(QuantScheme scheme, MatrixShape shape, long long expert, int row, int col) {
  switch (scheme) {
    case QuantScheme::kPerTensor: return expert;
    case QuantScheme::kPerChannelPerToken: return expert * shape.rows + row;
    default: {
      const int row_blocks = (shape.rows + kBlock - 1) / kBlock, col_blocks = (shape.cols + kBlock - 1) / kBlock;
      return (expert * row_blocks + row / kBlock) * col_blocks + col / kBlock;
    }
  }
}

// One block per weight row; a warp reads 128 columns per step. amax (as float bits) per group.
__global__ void __launch_bounds__(kThreads) weight_amax_kernel(const __nv_bfloat16* __restrict__ weights,
                                                               QuantScheme scheme, MatrixShape shape, float* amax) {
  const long long global_row = blockIdx.x;
  const long long expert = global_row / shape.rows;
  const int row = static_cast<int>(global_row % shape.rows);
  const __nv_bfloat16* in = weights + global_row * shape.cols;
  const int lane = threadIdx.x % 32;
  float row_max = 0.0f;
  for (int chunk = threadIdx.x / 32; chunk * kBlock < shape.cols; chunk += kThreads / 32) {
    float local = 0.0f;
    const int column = chunk * kBlock + 4 * lane;
    if (column < shape.cols) {
      #pragma unroll
      for (int i = 0; i < 4; ++i) local = fmaxf(local, fabsf(__bfloat162float(in[column + i])));
    }
    #pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, offset));
    if (scheme == QuantScheme::kBlock128) {
      if (lane == 0 && local > 0.0f) quant::atomic_max_abs(&amax[group_of(scheme, shape, expert, row, chunk * kBlock)], local);
    } else {
      row_max = fmaxf(row_max, local);
    }
  }
  if (scheme != QuantScheme::kBlock128 && lane == 0 && row_max > 0.0f)
    quant::atomic_max_abs(&amax[group_of(scheme, shape, expert, row, 0)], row_max);
}

__global__ void weight_scales_kernel(float* scales, long long count, bool ue8m0) {
  for (long long g = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; g < count;
       g += static_cast<long long>(gridDim.x) * blockDim.x)
    scales[g] = quant::fp8_scale(scales[g], ue8m0);
}

__global__ void __launch_bounds__(kThreads) weight_values_kernel(const __nv_bfloat16* __restrict__ weights,
                                                                 QuantScheme scheme, MatrixShape shape,
                                                                 const float* __restrict__ scales,
                                                                 std::uint8_t* __restrict__ values) {
  const long long global_row = blockIdx.x;
  const long long expert = global_row / shape.rows;
  const int row = static_cast<int>(global_row % shape.rows);
  const __nv_bfloat16* in = weights + global_row * shape.cols;
  std::uint8_t* out = values + global_row * shape.cols;
  for (int column = threadIdx.x; column < shape.cols; column += kThreads)
    out[column] = quant::to_e4m3(__bfloat162float(in[column]), scales[group_of(scheme, shape, expert, row, column)]);
}

}  // namespace

std::size_t weight_scale_count(const MoeSpec& spec, WeightMatrix matrix) {
  validate(spec);
  const MatrixShape shape = shape_of(spec, matrix);
  const std::size_t experts = shape.experts;
  switch (spec.scheme) {
    case QuantScheme::kNone: return 0;
    case QuantScheme::kPerTensor: return experts;
    case QuantScheme::kPerChannelPerToken: return experts * shape.rows;
    case QuantScheme::kBlock128:
      return experts * ((shape.rows + kBlock - 1) / kBlock) * ((shape.cols + kBlock - 1) / kBlock);
  }
  return 0;
}

void quantize_weights(const MoeSpec& spec, WeightMatrix matrix, const void* bf16_weights, void* fp8_weights,
                      float* scales, cudaStream_t stream) {
  validate(spec);
  if (spec.weight_dtype != WeightDType::kFP8E4M3)
    throw Error("hmoe: quantize_weights: MoeSpec.weight_dtype = bf16: expected an FP8 spec (the scheme decides the scales)");
  if (matrix != WeightMatrix::kW13 && matrix != WeightMatrix::kW2)
    throw Error("hmoe: quantize_weights: invalid matrix = " + std::to_string(static_cast<int>(matrix)) +
                ": expected kW13 or kW2");
  const struct { const char* name; const void* pointer; std::size_t alignment; } pointers[] = {
      {"bf16_weights", bf16_weights, 16}, {"fp8_weights", fp8_weights, 16}, {"scales", scales, 4}};
  for (const auto& entry : pointers) {
    if (entry.pointer == nullptr) throw Error(std::string("hmoe: quantize_weights: ") + entry.name + " is null");
    if (reinterpret_cast<std::uintptr_t>(entry.pointer) % entry.alignment != 0)
      throw Error(std::string("hmoe: quantize_weights: ") + entry.name + " is not " +
                  std::to_string(entry.alignment) + "-byte aligned");
  }
  const MatrixShape shape = shape_of(spec, matrix);
  const long long rows = static_cast<long long>(shape.experts) * shape.rows;
  const std::size_t count = weight_scale_count(spec, matrix);
  const auto* source = static_cast<const __nv_bfloat16*>(bf16_weights);
  HMOE_CUDA_CHECK(cudaMemsetAsync(scales, 0, count * sizeof(float), stream));
  weight_amax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(source, spec.scheme, shape, scales);
  HMOE_CUDA_CHECK(cudaGetLastError());
  weight_scales_kernel<<<static_cast<unsigned>(std::min<std::size_t>((count + 255) / 256, 1024)), 256, 0, stream>>>(
      scales, static_cast<long long>(count), spec.ue8m0_scales);
  HMOE_CUDA_CHECK(cudaGetLastError());
  weight_values_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(source, spec.scheme, shape, scales,
                                                                             static_cast<std::uint8_t*>(fp8_weights));
  HMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hmoe
