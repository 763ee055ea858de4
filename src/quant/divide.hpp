// value / scale for quantisers that divide many values by one scale (GEMM1's fused re-quantisation,
// gemm/epilogue.cuh): the reciprocal is rounded once, then each quotient costs a multiply and two FMAs
// instead of a full division sequence with its slow-path branch. q = RN(v · RN(1/s)) is within an ulp
// or two of v/s, the residual v − q·s is exact in an FMA, and one correction step rounds q correctly
// (Markstein's theorem) — wherever the residual does not underflow. A scale below 2^-60 and its values
// are first multiplied by 2^100 (exact: a power of two), and the sign is copied back (−0 / s = −0).
// What remains inexact is |quotient| < 2^-11 for values tiny next to the scale's amax, where e4m3
// rounds both to a zero of the same sign. Checked on the host over every bf16 amax, every bf16 value
// of at most that magnitude, both signs, with and without UE8M0 scales (2.1e9 quotients, 2026-12-06):
// no e4m3 byte differs from e4m3(value / scale), and every quotient of magnitude ≥ 2^-11 is bit-equal
// to the division (tests/cpu/test_quant_divide.cpp checks a strided share of that set).
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>

namespace hmoe::quant {

struct Divisor {
  float scale;        // the divisor, times factor
  float reciprocal;   // RN(1 / scale)
  float factor;       // 1, or 2^100 for a scale below 2^-60
};

__host__ __device__ inline Divisor make_divisor(float scale) {
  const float factor = scale < 0x1p-60f ? 0x1p100f : 1.0f;
  const float scaled = scale * factor;
#ifdef __CUDA_ARCH__
  return Divisor{scaled, __frcp_rn(scaled), factor};
#else
  return Divisor{scaled, 1.0f / scaled, factor};
#endif
}

// value / divisor's scale, rounded to nearest even where |result| ≥ 2^-11 (above); value finite and
// |value| ≤ 448 · scale (the scale derived from an amax of at least |value|).
__host__ __device__ inline float divide_rn(float value, const Divisor& divisor) {
  const float v = value * divisor.factor;
#ifdef __CUDA_ARCH__
  const float q = __fmul_rn(v, divisor.reciprocal);
  const float residual = __fmaf_rn(-q, divisor.scale, v);
  return copysignf(__fmaf_rn(residual, divisor.reciprocal, q), v);
#else
  const float q = v * divisor.reciprocal;
  const float residual = std::fma(-q, divisor.scale, v);
  return std::copysign(std::fma(residual, divisor.reciprocal, q), v);
#endif
}

// value / scale for a scale nobody derived from an amax — fp8-tensor's static intermediate scale, which
// GEMM1's fused re-quantisation divides by (gemm/epilogue.cuh) and the separate pass divides by with
// __fdiv_rn — so that the e4m3 byte is the separate pass's for any scale and value. divide_rn's
// conditions: a scale in (0, 2^126] (a larger one has a subnormal reciprocal, too coarse for the
// correction step; zero, negative, infinite or NaN ones are the caller's to give) and a finite quotient
// (values past 448 · scale only saturate, but an infinite value, or a quotient past the float range,
// makes divide_rn's residual NaN).
struct StaticDivisor {
  Divisor divisor;
  float scale;
  bool usual;   // scale in (0, 2^126]
};

__host__ __device__ inline StaticDivisor make_static_divisor(float scale) {
  const bool usual = scale > 0.0f && scale <= 0x1p126f;   // (false for NaN)
  return StaticDivisor{make_divisor(usual ? scale : 1.0f), scale, usual};
}

// Divides `values` in place: divide_rn for all where the scale and every quotient meet its conditions,
// else the IEEE division for all (equal to divide_rn wherever divide_rn is exact), in one branch.
// NOTE: the IEEE fallback a value (a data-dependent __fdiv_rn beside each of a thread's 64 quotients) made
// qwen3-30b-a3b fp8-tensor T = 16384 2.0 % slower than the separate pass (H100, docs/PERF.md 26th session);
// a select a value (`values[i] = unusual ? __fdiv_rn(..) : quotient[i]`) still compiled to a branch and a
// reconvergence region a value, and the finiteness checks to one chain of dependent compares (docs/PERF.md,
// 27th session). Hence the explicit `if` around the whole fallback, and four independent partial checks.
template <int kCount>
__host__ __device__ inline void divide_static_rn(float (&values)[kCount], const StaticDivisor& divisor) {
  constexpr int kChecks = kCount < 4 ? kCount : 4;
  float quotient[kCount];
  bool finite[kChecks];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int c = 0; c < kChecks; ++c) finite[c] = true;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 0; i < kCount; ++i) {
    quotient[i] = divide_rn(values[i], divisor.divisor);
#ifdef __CUDA_ARCH__
    finite[i % kChecks] &= isfinite(quotient[i]);
#else
    finite[i % kChecks] &= std::isfinite(quotient[i]);
#endif
  }
  bool unusual = !divisor.usual;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int c = 0; c < kChecks; ++c) unusual |= !finite[c];
  if (unusual) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int i = 0; i < kCount; ++i) {
#ifdef __CUDA_ARCH__
      values[i] = __fdiv_rn(values[i], divisor.scale);
#else
      values[i] = values[i] / divisor.scale;
#endif
    }
    return;
  }
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 0; i < kCount; ++i) values[i] = quotient[i];
}

}  // namespace hmoe::quant
