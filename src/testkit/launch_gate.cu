#include "testkit/launch_gate.hpp"

#include "common/cuda_check.hpp"

namespace hmoe::testkit {
namespace {

constexpr long long kGiveUpNs = 1'000'000'000;   // about a second

__global__ void gate_kernel(const volatile int* flag) {
  long long start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (*flag == 0) {
    long long now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > kGiveUpNs) return;
    __nanosleep(200);
  }
}

}  // namespace

LaunchGate::LaunchGate() {
  void* host = nullptr;
  HMOE_CUDA_CHECK(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped));
  flag_ = static_cast<volatile int*>(host);
  *flag_ = 0;
  void* device = nullptr;
  HMOE_CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
  device_flag_ = static_cast<int*>(device);
}

LaunchGate::~LaunchGate() {
  if (flag_ != nullptr) cudaFreeHost(const_cast<int*>(flag_));
}

void LaunchGate::hold(cudaStream_t stream) {
  *flag_ = 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  gate_kernel<<<1, 1, 0, stream>>>(device_flag_);
  HMOE_CUDA_CHECK(cudaGetLastError());
}

void LaunchGate::release() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  *flag_ = 1;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

}  // namespace hmoe::testkit
