// Instantiates launch_scheme<kScheme> (decode_layer.cuh) in the including .cu file.
#pragma once

#include "common/cuda_check.hpp"
#include "decode/decode_layer.cuh"

namespace hmoe::decode {

template <Scheme kScheme>
void launch_scheme(const KernelArgs* args, int per_lane, int num_sms, std::size_t shared_bytes, cudaStream_t stream) {
  // [experts ≤ 128 / ≤ 256][T = 1 / T ≤ kMaxTokens]
  void (*const kernels[2][2])(KernelArgs) = {
      {decode_layer_kernel<4, 1, kScheme>, decode_layer_kernel<4, kMaxTokens, kScheme>},
      {decode_layer_kernel<8, 1, kScheme>, decode_layer_kernel<8, kMaxTokens, kScheme>}};
  if (args == nullptr) {   // prepare: load both and allow the largest dynamic shared memory
    for (auto& row : kernels)
      for (auto* kernel : row)
        HMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(shared_bytes)));
    return;
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(num_sms);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  HMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernels[per_lane <= 4 ? 0 : 1][args->num_tokens == 1 ? 0 : 1], *args));
}

}  // namespace hmoe::decode
