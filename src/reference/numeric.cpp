// Bit-exact bf16 and e4m3fn conversions, and the error metric every accuracy check reports.
// These define the rounding the GPU kernels must reproduce, so they avoid any fast-math shortcut.
#include <bit>
#include <cmath>

#include "reference/reference.hpp"

namespace hmoe::reference {

std::uint16_t float_to_bf16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  // NOTE: NaN must stay NaN; rounding could carry a NaN payload into the exponent (Inf).
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  const std::uint32_t round_to_nearest_even = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + round_to_nearest_even) >> 16);
}

float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

namespace {
constexpr int kE4m3ExponentBias = 7;
constexpr int kE4m3MantissaBits = 3;
constexpr int kFloatMantissaBits = 23;
constexpr std::uint8_t kE4m3NaN = 0x7F;
constexpr std::uint8_t kE4m3MaxBits = 0x7E;         // 448 = 2^8 × 1.75
const float kE4m3SubnormalStep = std::ldexp(1.0f, -9);  // smallest subnormal, 2^-6 / 8
}  // namespace

std::uint8_t float_to_e4m3(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint8_t sign = static_cast<std::uint8_t>((bits >> 24) & 0x80);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (std::isnan(value)) return sign | kE4m3NaN;
  // Everything from 448 up (464, the midpoint to a missing 480, and Inf included) saturates.
  if (magnitude >= std::bit_cast<std::uint32_t>(kE4m3Max)) return sign | kE4m3MaxBits;
  if (magnitude < std::bit_cast<std::uint32_t>(std::ldexp(1.0f, 1 - kE4m3ExponentBias))) {
    // Below 2^-6: adding 2^14, whose float ulp is the subnormal step 2^-9, makes the float adder
    // round to a whole number of steps (to nearest even); 8 steps is the encoding of 2^-6.
    const float shift = std::ldexp(1.0f, kFloatMantissaBits - 9);
    const float rounded = std::bit_cast<float>(magnitude) + shift;
    return sign | static_cast<std::uint8_t>(std::bit_cast<std::uint32_t>(rounded) -
                                            std::bit_cast<std::uint32_t>(shift));
  }
  // Normal: drop 20 of the 23 mantissa bits with round-to-nearest-even; a carry moves into the
  // exponent as it should, then the exponent is rebiased from 127 to 7.
  constexpr int kDropped = kFloatMantissaBits - kE4m3MantissaBits;
  const std::uint32_t odd = (magnitude >> kDropped) & 1u;
  const std::uint32_t rounded = (magnitude + ((1u << (kDropped - 1)) - 1) + odd) >> kDropped;
  return sign | static_cast<std::uint8_t>(rounded - ((127 - kE4m3ExponentBias) << kE4m3MantissaBits));
}

float e4m3_to_float(std::uint8_t bits) {
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  const int biased_exponent = (bits >> kE4m3MantissaBits) & 0xF;
  const int mantissa = bits & 0x7;
  if ((bits & 0x7F) == kE4m3NaN) return std::copysign(NAN, sign);
  if (biased_exponent == 0) return sign * static_cast<float>(mantissa) * kE4m3SubnormalStep;
  return sign * std::ldexp(1.0f + mantissa / 8.0f, biased_exponent - kE4m3ExponentBias);
}

float round_up_pow2(float value) {
  int exponent = 0;
  const float fraction = std::frexp(value, &exponent);
  return fraction == 0.5f ? value : std::ldexp(1.0f, exponent);
}

double relative_error(const double* ref, const double* out, std::size_t n) {
  double diff_squared = 0.0, ref_squared = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    diff_squared += (out[i] - ref[i]) * (out[i] - ref[i]);
    ref_squared += ref[i] * ref[i];
  }
  // An all-zero reference has no scale to be relative to: only an exact match passes.
  if (ref_squared == 0.0) return diff_squared == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(diff_squared / ref_squared);
}

}  // namespace hmoe::reference
