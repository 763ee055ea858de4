// The host-side cost floor of the enqueues a layer is made of: an empty kernel launch and one TMA
// descriptor encode, timed on the CPU the same way measure_host_overhead times a whole layer.
#include <algorithm>
#include <chrono>
#include <vector>

#include "gemm/tensor_map.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/host_overhead.hpp"

namespace hmoe::testkit {
namespace {

__global__ void empty_kernel(int* never_written) {
  if (never_written != nullptr && threadIdx.x == 1024) *never_written = 0;
}

template <class Call>
double median_us(int calls, const Stream& stream, Call&& call) {
  std::vector<double> call_us;
  call_us.reserve(calls);
  for (int index = 0; index < calls; ++index) {
    const auto start = std::chrono::steady_clock::now();
    call();
    const auto stop = std::chrono::steady_clock::now();
    call_us.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
    if ((index + 1) % 32 == 0) stream.synchronize();
  }
  stream.synchronize();
  std::nth_element(call_us.begin(), call_us.begin() + call_us.size() / 2, call_us.end());
  return call_us[call_us.size() / 2];
}

}  // namespace

LaunchCosts measure_launch_costs(int calls) {
  const Stream stream;
  DeviceBuffer target(1 << 20);
  LaunchCosts costs;
  const auto launch = [&] {
    empty_kernel<<<1, 32, 0, stream.get()>>>(nullptr);
    HMOE_CUDA_CHECK(cudaGetLastError());
  };
  median_us(32, stream, launch);   // warm-up: module load
  costs.empty_launch_us = median_us(calls, stream, launch);
  costs.tensor_map_encode_us = median_us(calls, stream, [&] {
    const CUtensorMap map = gemm::make_tensor_map(target.get(), 256, 2048, 64, 2);
    static_cast<void>(map);
  });
  return costs;
}

}  // namespace hmoe::testkit
