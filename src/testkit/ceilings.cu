// Ceiling measurements: medians of event-timed repetitions after warm-up, on buffers far larger
// than L2 so every byte comes from HBM.
#include "testkit/ceilings.hpp"

#include <cublas_v2.h>

#include <cstdint>
#include <string>
#include <vector>

#include "testkit/cuda_handles.hpp"
#include "testkit/device.hpp"
#include "testkit/random_inputs.hpp"

#define HMOE_CUBLAS_CHECK(call)                                                                       \
  do {                                                                                                \
    const cublasStatus_t hmoe_cublas_status_ = (call);                                                \
    if (hmoe_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                 \
      throw ::hmoe::Error(std::string("hmoe: cuBLAS error ") + cublasGetStatusName(hmoe_cublas_status_) + \
                          " in " #call " at " __FILE__ ":" + std::to_string(__LINE__));               \
  } while (0)

namespace hmoe::testkit {
namespace {

constexpr std::size_t kStreamBytes = std::size_t{2} << 30;  // 2 GiB: ~35x the H200's L2
constexpr int kWarmupRepetitions = 3;
constexpr int kTimedRepetitions = 10;
constexpr int kGemmSize = 8192;

// Median milliseconds of `work`, each repetition timed alone with events.
template <class Work>
double median_ms(cudaStream_t stream, Work&& work) {
  for (int i = 0; i < kWarmupRepetitions; ++i) work();
  std::vector<Event> marks(kTimedRepetitions + 1);
  marks[0].record(stream);
  for (int i = 0; i < kTimedRepetitions; ++i) {
    work();
    marks[i + 1].record(stream);
  }
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> times;
  for (int i = 0; i < kTimedRepetitions; ++i) times.push_back(elapsed_ms(marks[i], marks[i + 1]));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Streams the buffer with four independent 16-byte loads in flight per thread; the xor result is
// stored only when it hits a value no input here produces, which keeps the loads alive.
__global__ void read_stream_kernel(const uint4* data, std::size_t count, unsigned* sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned folded = 0;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < count; i += 4 * stride) {
    const uint4 a = data[i];
    const uint4 b = data[i + stride];
    const uint4 c = data[i + 2 * stride];
    const uint4 d = data[i + 3 * stride];
    folded ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < count; i += stride) {
    const uint4 a = data[i];
    folded ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (folded == 0x9E3779B9u) atomicAdd(sink, 1u);
}

double measure_copy_gb_per_s(cudaStream_t stream) {
  const std::size_t half = kStreamBytes / 2;
  DeviceBuffer source(half);
  DeviceBuffer destination(half);
  HMOE_CUDA_CHECK(cudaMemsetAsync(source.get(), 0x5A, half, stream));
  const double ms = median_ms(stream, [&] {
    HMOE_CUDA_CHECK(cudaMemcpyAsync(destination.get(), source.get(), half, cudaMemcpyDeviceToDevice, stream));
  });
  return 2.0 * static_cast<double>(half) / (ms * 1e6);  // read + write bytes
}

double measure_read_gb_per_s(cudaStream_t stream) {
  DeviceBuffer data(kStreamBytes);
  DeviceBuffer sink(sizeof(unsigned));
  HMOE_CUDA_CHECK(cudaMemsetAsync(data.get(), 0x5A, kStreamBytes, stream));
  HMOE_CUDA_CHECK(cudaMemsetAsync(sink.get(), 0, sizeof(unsigned), stream));
  const int blocks = current_device_info().sm_count * 4;  // 4 × 512 threads: a full SM
  const std::size_t count = kStreamBytes / sizeof(uint4);
  const double ms = median_ms(stream, [&] {
    read_stream_kernel<<<blocks, 512, 0, stream>>>(data.as<const uint4>(), count, sink.as<unsigned>());
    HMOE_CUDA_CHECK(cudaGetLastError());
  });
  return static_cast<double>(kStreamBytes) / (ms * 1e6);
}

double measure_bf16_gemm_tflop_per_s(cudaStream_t stream) {
  const std::size_t elements = static_cast<std::size_t>(kGemmSize) * kGemmSize;
  DeviceBuffer a(elements * sizeof(std::uint16_t));
  DeviceBuffer b(elements * sizeof(std::uint16_t));
  DeviceBuffer c(elements * sizeof(std::uint16_t));
  // Random non-zero operands: tensor cores draw less power (and clock higher) on zeros.
  fill_uniform_bf16(a.as<std::uint16_t>(), elements, 1.0f, 8192, 1, stream);
  fill_uniform_bf16(b.as<std::uint16_t>(), elements, 1.0f, 8192, 2, stream);

  cublasHandle_t handle = nullptr;
  HMOE_CUBLAS_CHECK(cublasCreate(&handle));
  double ms = 0.0;
  try {
    HMOE_CUBLAS_CHECK(cublasSetStream(handle, stream));
    const float alpha = 1.0f / kGemmSize;
    const float beta = 0.0f;
    ms = median_ms(stream, [&] {
      HMOE_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, kGemmSize, kGemmSize, kGemmSize, &alpha,
                                     a.get(), CUDA_R_16BF, kGemmSize, b.get(), CUDA_R_16BF, kGemmSize, &beta,
                                     c.get(), CUDA_R_16BF, kGemmSize, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
  } catch (...) {
    cublasDestroy(handle);
    throw;
  }
  HMOE_CUBLAS_CHECK(cublasDestroy(handle));
  const double flops = 2.0 * kGemmSize * static_cast<double>(kGemmSize) * kGemmSize;
  return flops / (ms * 1e9);
}

Ceilings measure() {
  Stream stream;
  Ceilings ceilings;
  ceilings.copy_gb_per_s = measure_copy_gb_per_s(stream.get());
  ceilings.read_gb_per_s = measure_read_gb_per_s(stream.get());
  ceilings.bf16_gemm_tflop_per_s = measure_bf16_gemm_tflop_per_s(stream.get());
  return ceilings;
}

}  // namespace

const Ceilings& measured_ceilings() {
  static const Ceilings ceilings = measure();
  return ceilings;
}

}  // namespace hmoe::testkit
