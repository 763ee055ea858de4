// Puts the GPU's L2 cache in one known state before a timed call: a read pass over twice its size
// evicts whatever earlier work left there (and writes back its dirty lines before the timing starts),
// so a first call and the steady calls it is compared with start from the same cache contents.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "testkit/cuda_handles.hpp"

namespace hmoe::testkit {

class L2Reset {
 public:
  explicit L2Reset(std::size_t l2_bytes);   // the device's L2 size (DeviceInfo::l2_bytes)
  // Enqueues the read pass; the caller synchronises before it starts a timing.
  void run(cudaStream_t stream) const;
  std::size_t bytes() const { return buffer_.bytes(); }

 private:
  DeviceBuffer buffer_;   // 2 × L2, zeroed once
  DeviceBuffer sink_;     // written only if the read values hash to a magic number (never, for zeros)
};

}  // namespace hmoe::testkit
