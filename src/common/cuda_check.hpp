// Turns a failed CUDA runtime call into hmoe::Error naming the call and where it was made.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "hmoe/hmoe.hpp"

namespace hmoe::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw Error(std::string("hmoe: CUDA error ") + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ") in " + call + " at " + file + ":" + std::to_string(line));
}

}  // namespace hmoe::detail

#define HMOE_CUDA_CHECK(call)                                                          \
  do {                                                                                 \
    const cudaError_t hmoe_status_ = (call);                                           \
    if (hmoe_status_ != cudaSuccess)                                                   \
      ::hmoe::detail::throw_cuda_error(hmoe_status_, #call, __FILE__, __LINE__);       \
  } while (0)
