// Ceiling measurements: medians of event-timed repetitions after warm-up, on buffers far larger
// than L2 so every byte comes from HBM.
#include "testkit/ceilings.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "testkit/cublas_check.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/device.hpp"
#include "testkit/random_inputs.hpp"

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

// Converts fp32 values to e4m3 (saturating; the inputs lie in (-1, 1), far from NaN patterns).
__global__ void fp32_to_e4m3_kernel(const float* source, __nv_fp8_storage_t* destination, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    destination[i] = __nv_cvt_float_to_fp8(source[i], __NV_SATFINITE, __NV_E4M3);
}

// cuBLASLt objects released on every path (an exception halfway must not leak them).
template <class Handle, auto Destroy>
using LtObject = std::unique_ptr<std::remove_pointer_t<Handle>, std::integral_constant<decltype(Destroy), Destroy>>;
using LtHandle = LtObject<cublasLtHandle_t, &cublasLtDestroy>;
using LtMatmulDesc = LtObject<cublasLtMatmulDesc_t, &cublasLtMatmulDescDestroy>;
using LtLayout = LtObject<cublasLtMatrixLayout_t, &cublasLtMatrixLayoutDestroy>;
using LtPreference = LtObject<cublasLtMatmulPreference_t, &cublasLtMatmulPreferenceDestroy>;

LtLayout make_layout(cudaDataType_t type, std::uint64_t rows, std::uint64_t columns, std::int64_t leading_dimension) {
  cublasLtMatrixLayout_t layout = nullptr;
  HMOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, rows, columns, leading_dimension));
  return LtLayout(layout);
}

template <class Value>
void set_matmul_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const Value& value) {
  HMOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

double measure_fp8_gemm(cudaStream_t stream) {
  constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;
  const std::size_t elements = static_cast<std::size_t>(kGemmSize) * kGemmSize;
  DeviceBuffer a(elements);  // e4m3, one byte each
  DeviceBuffer b(elements);
  DeviceBuffer d(elements * sizeof(std::uint16_t));  // bf16
  DeviceBuffer a_scale_buffer(sizeof(float));         // own allocations: 256-byte aligned
  DeviceBuffer b_scale_buffer(sizeof(float));
  DeviceBuffer workspace(kWorkspaceBytes);
  {
    // Random non-zero operands (as for bf16): draw fp32, convert.
    DeviceBuffer staging(elements * sizeof(float));
    const unsigned blocks = static_cast<unsigned>(current_device_info().sm_count) * 8;
    for (int operand = 0; operand < 2; ++operand) {
      fill_uniform_f32(staging.as<float>(), elements, 1.0f, 8192, 3 + operand, stream);
      fp32_to_e4m3_kernel<<<blocks, 256, 0, stream>>>(staging.as<const float>(),
                                                      (operand == 0 ? a : b).as<__nv_fp8_storage_t>(), elements);
      HMOE_CUDA_CHECK(cudaGetLastError());
    }
    copy_to_device(a_scale_buffer.get(), std::vector<float>{1.0f}, stream);
    copy_to_device(b_scale_buffer.get(), std::vector<float>{1.0f / kGemmSize}, stream);  // synchronises
  }

  cublasLtHandle_t raw_handle = nullptr;
  HMOE_CUBLAS_CHECK(cublasLtCreate(&raw_handle));
  const LtHandle handle(raw_handle);
  cublasLtMatmulDesc_t raw_desc = nullptr;
  HMOE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const LtMatmulDesc desc(raw_desc);
  // NOTE: Hopper's FP8 GEMMs exist only for the "TN" layout (A transposed, column-major operands):
  // both operands then run along K, the only arrangement cuBLASLt offers for e4m3.
  set_matmul_attribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_matmul_attribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  const float* a_scale = a_scale_buffer.as<const float>();
  const float* b_scale = b_scale_buffer.as<const float>();
  set_matmul_attribute(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale);
  set_matmul_attribute(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
  const std::int8_t fast_accumulation = 1;
  set_matmul_attribute(desc.get(), CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accumulation);

  // Column-major: A is K×M read transposed, B is K×N, C = D are M×N bf16.
  const LtLayout a_layout = make_layout(CUDA_R_8F_E4M3, kGemmSize, kGemmSize, kGemmSize);
  const LtLayout b_layout = make_layout(CUDA_R_8F_E4M3, kGemmSize, kGemmSize, kGemmSize);
  const LtLayout d_layout = make_layout(CUDA_R_16BF, kGemmSize, kGemmSize, kGemmSize);

  cublasLtMatmulPreference_t raw_preference = nullptr;
  HMOE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_preference));
  const LtPreference preference(raw_preference);
  const std::size_t workspace_bytes = kWorkspaceBytes;
  HMOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes, sizeof(workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  HMOE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle.get(), desc.get(), a_layout.get(), b_layout.get(),
                                                   d_layout.get(), d_layout.get(), preference.get(), 1, &heuristic,
                                                   &found));
  if (found < 1 || heuristic.state != CUBLAS_STATUS_SUCCESS)
    throw Error("hmoe: cuBLASLt offers no FP8 e4m3 GEMM algorithm for 8192^3 TN on this device");

  const float alpha = 1.0f;
  const float beta = 0.0f;
  const double ms = median_ms(stream, [&] {
    HMOE_CUBLAS_CHECK(cublasLtMatmul(handle.get(), desc.get(), &alpha, a.get(), a_layout.get(), b.get(),
                                     b_layout.get(), &beta, d.get(), d_layout.get(), d.get(), d_layout.get(),
                                     &heuristic.algo, workspace.get(), kWorkspaceBytes, stream));
  });
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));  // before the buffers and objects go
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

double measured_fp8_gemm_tflop_per_s() {
  static const double tflop_per_s = [] {
    Stream stream;
    return measure_fp8_gemm(stream.get());
  }();
  return tflop_per_s;
}

}  // namespace hmoe::testkit
