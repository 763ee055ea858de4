// Device discovery for the testkit: the Hopper gate every GPU test and GPU command passes first.
#include "testkit/device.hpp"

#include <cuda_runtime_api.h>

#include <sstream>

#include "common/cuda_check.hpp"

namespace hmoe::testkit {

bool hopper_gpu_available(std::string* reason) {
  auto fail = [reason](const std::string& why) {
    if (reason != nullptr) *reason = why;
    return false;
  };
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess)
    return fail(std::string("no usable CUDA device (") + cudaGetErrorString(status) + ")");
  if (count == 0) return fail("no CUDA device found");
  int device = 0;
  cudaDeviceProp props{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&props, device) != cudaSuccess)
    return fail("cannot query CUDA device properties");
  if (props.major != 9 || props.minor != 0) {
    std::ostringstream why;
    why << "device " << device << " (" << props.name << ") is compute capability " << props.major << "."
        << props.minor << "; hmoe needs 9.0 (Hopper, sm_90a)";
    return fail(why.str());
  }
  return true;
}

DeviceInfo current_device_info() {
  int device = 0;
  HMOE_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp props{};
  HMOE_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
  DeviceInfo info;
  info.name = props.name;
  info.sm_count = props.multiProcessorCount;
  info.l2_bytes = props.l2CacheSize;
  info.cc_major = props.major;
  info.cc_minor = props.minor;
  info.memory_bytes = props.totalGlobalMem;
  return info;
}

std::string describe(const DeviceInfo& info) {
  std::ostringstream text;
  text << info.name << " (" << info.sm_count << " SMs, " << (info.l2_bytes >> 20) << " MiB L2, "
       << (info.memory_bytes >> 30) << " GiB, compute capability " << info.cc_major << "." << info.cc_minor
       << ")";
  return text.str();
}

}  // namespace hmoe::testkit
