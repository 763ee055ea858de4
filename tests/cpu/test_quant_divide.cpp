// quant::divide_rn (src/quant/divide.hpp), the reciprocal-and-FMA division GEMM1's fused
// re-quantisation uses, against the correctly rounded division the reference and the separate pass use:
// the same e4m3 byte for every checked (amax, value) pair, and the same float wherever the quotient is
// large enough for e4m3 to see it. The header's note gives the exhaustive check; this is a strided share.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "quant/divide.hpp"
#include "reference/reference.hpp"

namespace hmoe::quant {
namespace {

using reference::bf16_to_float;
using reference::float_to_e4m3;

// The reference's scale (amax / 448, UE8M0 when asked), as both quantisers compute it.
float scale_of(float amax, bool ue8m0) { return reference::fp8_scale(amax, ue8m0); }

std::uint32_t float_bits(float value) { return std::bit_cast<std::uint32_t>(value); }

TEST(QuantDivide, MatchesTheDivisionForEveryE4m3Byte) {
  long long checked = 0, inexact_large = 0, e4m3_differs = 0;
  // Every 7th positive finite bf16 amax (subnormals and the 2^-60 boundary among them) and the
  // largest, and for each every 11th bf16 value up to it plus the 16 largest, both signs.
  const auto check_amax = [&](std::uint32_t amax_bits) {
    const float amax = bf16_to_float(amax_bits);
    for (bool ue8m0 : {false, true}) {
      const float scale = scale_of(amax, ue8m0);
      const Divisor divisor = make_divisor(scale);
      const auto check = [&](std::uint32_t value_bits) {
        for (float sign : {1.0f, -1.0f}) {
          const float value = sign * bf16_to_float(value_bits);
          const float expected = value / scale, got = divide_rn(value, divisor);
          ++checked;
          if (float_to_e4m3(expected) != float_to_e4m3(got) && ++e4m3_differs <= 5)
            ADD_FAILURE() << "e4m3 byte differs: amax " << amax << " ue8m0 " << ue8m0 << " value " << value;
          if (std::fabs(expected) >= 0x1p-11f && float_bits(expected) != float_bits(got) && ++inexact_large <= 5)
            ADD_FAILURE() << "quotient differs: amax " << amax << " ue8m0 " << ue8m0 << " value " << value
                          << " expected " << expected << " got " << got;
        }
      };
      for (std::uint32_t value_bits = 0; value_bits <= amax_bits; value_bits += 11) check(value_bits);
      for (std::uint32_t value_bits = amax_bits >= 16 ? amax_bits - 15 : 0; value_bits <= amax_bits; ++value_bits)
        check(value_bits);
    }
  };
  for (std::uint32_t amax_bits = 1; amax_bits < 0x7f80; amax_bits += 7) check_amax(amax_bits);
  check_amax(0x7f7f);
  EXPECT_EQ(e4m3_differs, 0);
  EXPECT_EQ(inexact_large, 0);
  EXPECT_GT(checked, 10'000'000);
}

// The edges the header names: a zero keeps its sign, a scale below 2^-60 goes through the 2^100
// factor, and the largest value maps to 448 exactly.
TEST(QuantDivide, EdgesKeepSignAndRange) {
  const Divisor unit = make_divisor(1.0f);
  EXPECT_EQ(float_bits(divide_rn(-0.0f, unit)), float_bits(-0.0f));
  EXPECT_EQ(float_bits(divide_rn(0.0f, unit)), float_bits(0.0f));
  const float tiny_amax = bf16_to_float(0x0001);   // the smallest bf16 subnormal
  const float tiny_scale = scale_of(tiny_amax, false);
  const Divisor tiny = make_divisor(tiny_scale);
  EXPECT_EQ(tiny.factor, 0x1p100f);
  EXPECT_EQ(divide_rn(tiny_amax, tiny), tiny_amax / tiny_scale);
  const float big_amax = bf16_to_float(0x7f7f);    // the largest finite bf16
  const Divisor big = make_divisor(scale_of(big_amax, false));
  EXPECT_EQ(big.factor, 1.0f);
  EXPECT_EQ(float_to_e4m3(divide_rn(big_amax, big)), float_to_e4m3(448.0f));
  EXPECT_EQ(float_to_e4m3(divide_rn(-big_amax, big)), float_to_e4m3(-448.0f));
}

// divide_static_rn, for scales a caller gave (fp8-tensor's static intermediate scale): the byte and, where
// e4m3 can see it, the float of the IEEE division for scales across the whole float range — subnormal, at
// the 2^-60 and 2^126 boundaries, huge — and the ones divide_rn cannot take (zero, negative, infinite,
// NaN), against values up to the largest bf16, infinities and NaN: each value alone, and in a batch of 32
// with one value that sends the whole batch to the IEEE division (as GEMM1's epilogue calls it).
TEST(QuantDivide, StaticScalesMatchTheDivisionForEveryValue) {
  long long checked = 0, inexact_large = 0, e4m3_differs = 0;
  const auto expect_division = [&](float scale, float value, float got) {
    const float expected = value / scale;
    ++checked;
    if (float_to_e4m3(expected) != float_to_e4m3(got) && ++e4m3_differs <= 5)
      ADD_FAILURE() << "e4m3 byte differs: scale " << scale << " value " << value;
    if (std::isfinite(expected) && std::fabs(expected) >= 0x1p-11f && float_bits(expected) != float_bits(got) &&
        ++inexact_large <= 5)
      ADD_FAILURE() << "quotient differs: scale " << scale << " value " << value << " expected " << expected
                    << " got " << got;
  };
  const auto check_scale = [&](float scale) {
    const StaticDivisor divisor = make_static_divisor(scale);
    const auto check = [&](float value) {
      float one[1] = {value};
      divide_static_rn(one, divisor);
      expect_division(scale, value, one[0]);
    };
    for (std::uint32_t value_bits = 0; value_bits < 0x7f80; value_bits += 13) {
      check(bf16_to_float(value_bits));
      check(-bf16_to_float(value_bits));
    }
    for (float value : {INFINITY, -INFINITY, NAN, 0x1p127f, -0x1p127f, 0.0f, -0.0f}) check(value);
    for (float odd : {1.0f, INFINITY, 0x1p127f}) {
      float batch[32], values[32];
      for (int i = 0; i < 32; ++i) values[i] = batch[i] = bf16_to_float(0x3f80 + 97 * i) * (i % 2 ? -1.0f : 1.0f);
      values[17] = batch[17] = odd;
      divide_static_rn(batch, divisor);
      for (int i = 0; i < 32; ++i) expect_division(scale, values[i], batch[i]);
    }
  };
  for (std::uint32_t scale_bits = 1; scale_bits < 0x7f800000u; scale_bits += 0x7f8000 / 3 + 17)
    check_scale(std::bit_cast<float>(scale_bits));
  for (float scale : {0.0f, -0.0f, -1.0f, -0x1p-70f, INFINITY, -INFINITY, NAN, 0x1p-60f, 0x1.fffffep-61f, 0x1p126f,
                      0x1.000002p126f, 0x1p127f, 0x1.fffffep127f, 0x1p-149f, 1.0f / 448.0f, 3.0f})
    check_scale(scale);
  EXPECT_EQ(e4m3_differs, 0);
  EXPECT_EQ(inexact_large, 0);
  EXPECT_GT(checked, 1'000'000);
}

}  // namespace
}  // namespace hmoe::quant
