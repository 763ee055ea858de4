// Device helpers every FP8 quantiser shares, matching the CPU reference's conventions exactly
// (reference/reference.hpp): scale = amax / 448 as a float division (rounded up to a power of two
// for UE8M0), an all-zero group gets scale 1, value = e4m3(v / scale) rounded to nearest even and
// saturated to ±448.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace hmoe::quant {

inline constexpr float kE4m3Max = 448.0f;

__device__ __forceinline__ float fp8_scale(float amax, bool ue8m0) {
  if (amax == 0.0f) return 1.0f;
  const float scale = __fdiv_rn(amax, kE4m3Max);
  if (!ue8m0) return scale;
  int exponent = 0;
  const float fraction = frexpf(scale, &exponent);
  return fraction == 0.5f ? scale : ldexpf(1.0f, exponent);
}

__device__ __forceinline__ std::uint8_t to_e4m3(float value, float scale) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(value, scale), __NV_SATFINITE, __NV_E4M3));
}

// Largest |value| of non-negative floats via their bit patterns (monotone for values ≥ +0).
__device__ __forceinline__ void atomic_max_abs(float* target, float value) {
  atomicMax(reinterpret_cast<int*>(target), __float_as_int(fabsf(value)));
}

}  // namespace hmoe::quant
