// One-time weight preparation: w13 rows regrouped for the fused SwiGLU epilogue (8 gate rows, then
// the 8 up rows of the same intermediate columns, repeated); w2 is used as it comes. bf16 or e4m3.
#include <cuda_bf16.h>

#include "common/cuda_check.hpp"
#include "gemm/config.hpp"
#include "hmoe/hmoe.hpp"

namespace hmoe {
namespace {

// One block per prepared row; 16-byte vectors (8 bf16 or 16 e4m3 values).
__global__ void interleave_w13_kernel(const uint4* __restrict__ source, uint4* __restrict__ destination,
                                      int intermediate, int vectors_per_row) {
  const long long prepared_row = blockIdx.x;
  const long long rows_per_expert = 2LL * intermediate;
  const long long expert = prepared_row / rows_per_expert;
  const int row = static_cast<int>(prepared_row % rows_per_expert);
  const int source_row = gemm::swiglu_source_row(row, intermediate);
  const uint4* from = source + (expert * rows_per_expert + source_row) * vectors_per_row;
  uint4* to = destination + prepared_row * vectors_per_row;
  for (int v = threadIdx.x; v < vectors_per_row; v += blockDim.x) to[v] = from[v];
}

std::size_t element_bytes(const MoeSpec& spec) { return spec.weight_dtype == WeightDType::kFP8E4M3 ? 1 : 2; }

}  // namespace

std::size_t prepared_w13_bytes(const MoeSpec& spec) {
  validate(spec);
  return static_cast<std::size_t>(spec.num_experts) * 2 * spec.intermediate * spec.hidden * element_bytes(spec);
}

std::size_t prepared_w2_bytes(const MoeSpec& spec) {
  validate(spec);
  return static_cast<std::size_t>(spec.num_experts) * spec.hidden * spec.intermediate * element_bytes(spec);
}

void prepare_weights(const MoeSpec& spec, const void* w13_src, const void* w2_src, void* w13_dst, void* w2_dst,
                     cudaStream_t stream) {
  validate(spec);
  const struct { const char* name; const void* pointer; } pointers[] = {
      {"w13_src", w13_src}, {"w2_src", w2_src}, {"w13_dst", w13_dst}, {"w2_dst", w2_dst}};
  for (const auto& entry : pointers) {
    if (entry.pointer == nullptr) throw Error(std::string("hmoe: prepare_weights: ") + entry.name + " is null");
    if (reinterpret_cast<std::uintptr_t>(entry.pointer) % 16 != 0)
      throw Error(std::string("hmoe: prepare_weights: ") + entry.name + " is not 16-byte aligned");
  }
  if (w13_src == w13_dst) throw Error("hmoe: prepare_weights: w13_dst must not alias w13_src (rows are regrouped)");
  const long long prepared_rows = 2LL * spec.num_experts * spec.intermediate;
  interleave_w13_kernel<<<static_cast<unsigned>(prepared_rows), 128, 0, stream>>>(
      static_cast<const uint4*>(w13_src), static_cast<uint4*>(w13_dst), spec.intermediate,
      static_cast<int>(spec.hidden * element_bytes(spec) / 16));
  HMOE_CUDA_CHECK(cudaGetLastError());
  if (w2_src != w2_dst)
    HMOE_CUDA_CHECK(cudaMemcpyAsync(w2_dst, w2_src, prepared_w2_bytes(spec), cudaMemcpyDeviceToDevice, stream));
}

}  // namespace hmoe
