// Holds a stream's queue closed while the host enqueues work behind it, so that events recorded
// around that work time the GPU alone: no launch latency, no host-side cost of the enqueue inside
// the interval. A kernel spins on a flag in host-mapped memory until release() sets it.
#pragma once

#include <cuda_runtime_api.h>

namespace hmoe::testkit {

class LaunchGate {
 public:
  LaunchGate();
  ~LaunchGate();
  LaunchGate(const LaunchGate&) = delete;
  LaunchGate& operator=(const LaunchGate&) = delete;

  // Enqueues the spinning kernel (one thread); work enqueued after it waits for release().
  void hold(cudaStream_t stream);
  // Lets the held stream go on. NOTE: the kernel gives up after about a second without a release,
  // so a host that fails between hold() and release() cannot hang the device.
  void release();

 private:
  volatile int* flag_ = nullptr;   // host-mapped
  int* device_flag_ = nullptr;     // its device address
};

}  // namespace hmoe::testkit
