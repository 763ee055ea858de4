// Which GPU this process sees, and whether hmoe's sm_90a kernels can run on it: tests skip and GPU
// commands of the CLI stop with one line when they cannot.
#pragma once

#include <cstddef>
#include <string>

namespace hmoe::testkit {

struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int l2_bytes = 0;
  int cc_major = 0;
  int cc_minor = 0;
  std::size_t memory_bytes = 0;
};

// True when the current device is compute capability 9.0; otherwise false and, when reason is not
// null, one line saying why (no driver, no device, wrong architecture).
bool hopper_gpu_available(std::string* reason);

// The current device; throws hmoe::Error when there is none.
DeviceInfo current_device_info();

// "NVIDIA H200 (132 SMs, 60 MiB L2, 140 GiB, compute capability 9.0)"
std::string describe(const DeviceInfo& info);

}  // namespace hmoe::testkit
