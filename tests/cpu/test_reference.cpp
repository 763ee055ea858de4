// Tests of the CPU reference: bit-exact number formats, routing semantics, FP8 quantisation and the
// layer against hand-worked and naively computed cases. Every GPU check trusts this oracle.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include "reference/reference.hpp"

namespace hmoe::reference {
namespace {

double silu(double v) { return v / (1.0 + std::exp(-v)); }

std::vector<std::uint16_t> random_bf16(std::size_t count, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<std::uint16_t> values(count);
  for (std::uint16_t& v : values) v = float_to_bf16(normal(rng));
  return values;
}

std::vector<int> first_tokens(int count) {
  std::vector<int> tokens(count);
  for (int t = 0; t < count; ++t) tokens[t] = t;
  return tokens;
}

// ---- bf16 ------------------------------------------------------------------------------------

TEST(Bf16, KnownValuesAndRoundToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80) << "tie rounds to the even 1.0";
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82) << "tie rounds to the even neighbour";
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81) << "above the tie";
  EXPECT_EQ(float_to_bf16(3.4e38f), 0x7F80) << "beyond the largest bf16 rounds to +Inf";
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(-NAN))));
}

TEST(Bf16, EveryNonNanPatternRoundTrips) {
  int mismatches = 0;
  for (int bits = 0; bits < 65536; ++bits) {
    const float value = bf16_to_float(static_cast<std::uint16_t>(bits));
    if (!std::isnan(value) && float_to_bf16(value) != bits) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- e4m3fn ----------------------------------------------------------------------------------

TEST(E4m3, KnownEncodings) {
  struct Case { float value; std::uint8_t bits; const char* why; };
  const float step = std::ldexp(1.0f, -9);  // smallest subnormal
  const Case cases[] = {
      {0.0f, 0x00, "zero"},
      {-0.0f, 0x80, "negative zero"},
      {1.0f, 0x38, "one"},
      {0.5f, 0x30, "one half"},
      {448.0f, 0x7E, "largest finite"},
      {-448.0f, 0xFE, "largest negative"},
      {464.0f, 0x7E, "midpoint to the missing 480 saturates"},
      {1.0e6f, 0x7E, "huge saturates"},
      {INFINITY, 0x7E, "+Inf saturates"},
      {-INFINITY, 0xFE, "-Inf saturates"},
      {step, 0x01, "smallest subnormal 2^-9"},
      {step / 2, 0x00, "half the smallest subnormal ties to even zero"},
      {step * 1.5f, 0x02, "1.5 steps ties to even 2 steps"},
      {step * 7.5f, 0x08, "7.5 steps rounds up into the smallest normal 2^-6"},
      {std::ldexp(1.0f, -6), 0x08, "smallest normal"},
      {1.0625f, 0x38, "tie between 1 and 1.125 goes to even 1"},
      {1.1875f, 0x3A, "tie between 1.125 and 1.25 goes to even 1.25"},
      {1.07f, 0x39, "above the tie goes to 1.125"},
      {240.0f, 0x77, "2^7 × 1.875"},
      {-0.75f, 0xB4, "negative: 2^-1 × 1.5"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_e4m3(c.value), c.bits) << c.why << ": value " << c.value;
  }
  EXPECT_EQ(float_to_e4m3(NAN) & 0x7F, 0x7F);
}

TEST(E4m3, DecodeTable) {
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x3B), 1.375f);
  // Positive encodings increase strictly, and every non-NaN encoding round-trips.
  for (int bits = 1; bits <= 0x7E; ++bits)
    EXPECT_LT(e4m3_to_float(bits - 1), e4m3_to_float(bits)) << "bits " << bits;
  for (int bits = 0; bits < 256; ++bits) {
    if ((bits & 0x7F) == 0x7F) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(bits)), bits) << "bits " << bits;
  }
}

TEST(E4m3, RoundsToNearestAgainstExhaustiveSearch) {
  // The nearest finite encoding by search, ties to the even mantissa, beyond 448 saturated.
  const auto nearest = [](float value) {
    int best = 0;
    double best_distance = INFINITY;
    for (int bits = 0; bits <= 0x7E; ++bits) {
      const double distance = std::fabs(double(e4m3_to_float(bits)) - std::fabs(value));
      const bool even_tie = distance == best_distance && (bits & 1) == 0;
      if (distance < best_distance || even_tie) {
        best = bits;
        best_distance = distance;
      }
    }
    if (std::fabs(value) > kE4m3Max) best = 0x7E;
    return best | (value < 0 ? 0x80 : 0);
  };
  std::vector<float> values;
  for (int bits = 1; bits <= 0x7E; ++bits) {
    const float midpoint = (e4m3_to_float(bits - 1) + e4m3_to_float(bits)) / 2;
    values.insert(values.end(), {midpoint, -midpoint});
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> log_magnitude(-12.0f, 9.2f);
  for (int i = 0; i < 20000; ++i) values.push_back(std::exp2(log_magnitude(rng)) * (i % 2 ? -1.0f : 1.0f));
  for (float value : values) ASSERT_EQ(float_to_e4m3(value), nearest(value)) << "value " << value;
}

TEST(Scales, RoundUpPow2) {
  EXPECT_EQ(round_up_pow2(1.0f), 1.0f);
  EXPECT_EQ(round_up_pow2(3.0f), 4.0f);
  EXPECT_EQ(round_up_pow2(4.0001f), 8.0f);
  EXPECT_EQ(round_up_pow2(0.3f), 0.5f);
  EXPECT_EQ(round_up_pow2(std::ldexp(1.0f, -130)), std::ldexp(1.0f, -130));
  EXPECT_EQ(round_up_pow2(std::ldexp(1.5f, -130)), std::ldexp(1.0f, -129));
  EXPECT_EQ(fp8_scale(0.0f, false), 1.0f) << "all-zero group";
  EXPECT_EQ(fp8_scale(896.0f, false), 2.0f);
  EXPECT_EQ(fp8_scale(500.0f, true), 2.0f);
}

TEST(RelativeError, KnownValueAndNonFinite) {
  const double ref[] = {3.0, 4.0};
  const double out[] = {3.0, 5.0};
  EXPECT_DOUBLE_EQ(relative_error(ref, out, 2), 0.2);
  EXPECT_EQ(relative_error(ref, ref, 2), 0.0);
  const double nan_out[] = {3.0, NAN};
  const double inf_out[] = {INFINITY, 4.0};
  EXPECT_EQ(relative_error(ref, nan_out, 2), INFINITY);
  EXPECT_EQ(relative_error(ref, inf_out, 2), INFINITY);
}

// ---- Routing ---------------------------------------------------------------------------------

MoeSpec softmax_spec(int experts, int top_k, bool renormalize) {
  MoeSpec spec;
  spec.num_experts = experts;
  spec.top_k = top_k;
  spec.routing.renormalize = renormalize;
  return spec;
}

TEST(Routing, SoftmaxTiesBreakToLowerIndex) {
  const float logits[] = {1.0f, 3.0f, 3.0f, 0.0f};
  const Routing routing = route(softmax_spec(4, 2, true), logits, 1);
  EXPECT_EQ(routing.ids, (std::vector<std::int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(routing.weights[0], 0.5f);
  EXPECT_FLOAT_EQ(routing.weights[1], 0.5f);

  const float flat[8] = {};
  const Routing uniform = route(softmax_spec(8, 3, false), flat, 1);
  EXPECT_EQ(uniform.ids, (std::vector<std::int32_t>{0, 1, 2}));
  EXPECT_FLOAT_EQ(uniform.weights[2], 0.125f) << "no renormalisation keeps the softmax probability";
}

TEST(Routing, SoftmaxDescendingOrderAndRenormalisation) {
  const float logits[] = {0.1f, 2.0f, -1.0f, 5.0f, 0.0f};
  double sum = 0.0;
  for (float l : logits) sum += std::exp(double(l));
  const double p3 = std::exp(5.0) / sum, p1 = std::exp(2.0) / sum, p0 = std::exp(0.1) / sum;

  const Routing plain = route(softmax_spec(5, 3, false), logits, 1);
  EXPECT_EQ(plain.ids, (std::vector<std::int32_t>{3, 1, 0}));
  EXPECT_NEAR(plain.weights[0], p3, 1e-7);
  EXPECT_NEAR(plain.weights[2], p0, 1e-7);

  const Routing renormalized = route(softmax_spec(5, 3, true), logits, 1);
  EXPECT_EQ(renormalized.ids, plain.ids);
  EXPECT_NEAR(renormalized.weights[1], p1 / (p3 + p1 + p0), 1e-7);
}

// E = 8 in 4 groups of 2, 2 groups kept, top-3, scaling 2.5; logits are the logits of chosen
// sigmoid values so the expectations read in sigmoid space.
MoeSpec grouped_spec() {
  MoeSpec spec;
  spec.num_experts = 8;
  spec.top_k = 3;
  spec.routing.function = RoutingFunction::kGroupedSigmoidTopK;
  spec.routing.num_groups = 4;
  spec.routing.topk_groups = 2;
  spec.routing.routed_scaling_factor = 2.5f;
  return spec;
}

std::vector<float> logits_of(const std::vector<double>& sigmoids) {
  std::vector<float> logits;
  for (double s : sigmoids) logits.push_back(static_cast<float>(std::log(s / (1.0 - s))));
  return logits;
}

TEST(Routing, GroupedHandWorked) {
  // Group scores (top-2 sums): 1.0, 1.2, 1.3, 1.25 -> groups 2 and 3 kept, so expert 0 (0.9, the
  // second best overall) is out; top-3 of {0.8, 0.5, 0.3, 0.95} is 7, 4, 5.
  const std::vector<float> logits = logits_of({0.9, 0.1, 0.6, 0.6, 0.8, 0.5, 0.3, 0.95});
  const Routing routing = route(grouped_spec(), logits.data(), 1);
  EXPECT_EQ(routing.ids, (std::vector<std::int32_t>{7, 4, 5}));
  EXPECT_NEAR(routing.weights[0], 0.95 / 2.25 * 2.5, 1e-6);
  EXPECT_NEAR(routing.weights[1], 0.80 / 2.25 * 2.5, 1e-6);
  EXPECT_NEAR(routing.weights[2], 0.50 / 2.25 * 2.5, 1e-6);
}

TEST(Routing, GroupedBiasSelectsButDoesNotWeigh) {
  // With the bias, biased scores are 0.9 0.1 | 0.6 0.6 | 0.8 0.5 | 0.7 0.45: group scores 1.0, 1.2,
  // 1.3, 1.15 keep groups 2 and 1; top-3 of {0.6, 0.6, 0.8, 0.5} is 4, then the tie 2 before 3.
  // Weights use the unbiased sigmoids 0.8, 0.6, 0.6.
  const std::vector<float> logits = logits_of({0.9, 0.1, 0.6, 0.6, 0.8, 0.5, 0.3, 0.95});
  const float bias[] = {0, 0, 0, 0, 0, 0, 0.4f, -0.5f};
  const Routing routing = route(grouped_spec(), logits.data(), 1, bias);
  EXPECT_EQ(routing.ids, (std::vector<std::int32_t>{4, 2, 3}));
  EXPECT_NEAR(routing.weights[0], 1.0, 1e-6);
  EXPECT_NEAR(routing.weights[1], 0.75, 1e-6);
  EXPECT_NEAR(routing.weights[2], 0.75, 1e-6);
}

TEST(Routing, GroupedTiedGroupsKeepLowerIndex) {
  // Groups 1 and 2 hold the same two scores in opposite order; only one group is kept.
  MoeSpec spec = grouped_spec();
  spec.routing.topk_groups = 1;
  spec.top_k = 1;
  const float logits[] = {-3, -3, 0.8f, -0.8f, -0.8f, 0.8f, -3, -3};
  const Routing routing = route(spec, logits, 1);
  EXPECT_EQ(routing.ids[0], 2);
  EXPECT_NEAR(routing.weights[0], 2.5, 1e-6);
}

TEST(Routing, RandomLogitsInvariants) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const char* name : {"deepseek-v3-tp8", "qwen3-30b-a3b", "olmoe-1b-7b"}) {
    const MoeSpec spec = preset(name);
    const int tokens = 32;
    std::vector<float> logits(std::size_t(tokens) * spec.num_experts), bias(spec.num_experts);
    for (float& l : logits) l = normal(rng);
    for (float& b : bias) b = 0.1f * normal(rng);
    const Routing routing = route(spec, logits.data(), tokens, bias.data());
    const bool grouped = spec.routing.function == RoutingFunction::kGroupedSigmoidTopK;
    const double expected_sum = grouped ? spec.routing.routed_scaling_factor : 1.0;
    const int group_size = spec.num_experts / spec.routing.num_groups;
    for (int t = 0; t < tokens; ++t) {
      double sum = 0.0;
      std::vector<bool> seen(spec.num_experts), group_used(spec.routing.num_groups);
      for (int j = 0; j < spec.top_k; ++j) {
        const int id = routing.ids[t * spec.top_k + j];
        ASSERT_TRUE(id >= 0 && id < spec.num_experts) << name;
        EXPECT_FALSE(seen[id]) << name << ": expert " << id << " chosen twice";
        seen[id] = true;
        group_used[id / group_size] = true;
        sum += routing.weights[t * spec.top_k + j];
      }
      if (spec.routing.renormalize || grouped) EXPECT_NEAR(sum, expected_sum, 1e-5) << name;
      else EXPECT_LT(sum, 1.0) << name;
      EXPECT_LE(std::count(group_used.begin(), group_used.end(), true), spec.routing.topk_groups) << name;
    }
  }
}

// ---- Quantisation ----------------------------------------------------------------------------

TEST(Quantize, PerChannelValuesAndLayout) {
  // Two experts × two rows × three columns; row (1, 0) has amax 3, so scale 3/448.
  std::vector<std::uint16_t> weights(12, float_to_bf16(0.5f));
  weights[6] = float_to_bf16(3.0f);
  weights[7] = float_to_bf16(1.5f);
  weights[8] = float_to_bf16(-0.75f);
  const QuantizedWeights q = quantize_weights(QuantScheme::kPerChannelPerToken, weights.data(), 2, 2, 3);
  ASSERT_EQ(q.scales.size(), 4u);
  EXPECT_FLOAT_EQ(q.scales[2], 3.0f / 448.0f);
  EXPECT_FLOAT_EQ(q.scales[0], 0.5f / 448.0f);
  EXPECT_EQ(q.values[6], 0x7E) << "the amax maps to 448";
  EXPECT_EQ(q.values[7], 0x76) << "half the amax maps to 224";
  EXPECT_EQ(q.values[8], 0xEE) << "a quarter, negative, maps to -112";
  double row[3];
  dequantize_weight_row(q, 1, 0, row);
  EXPECT_NEAR(row[0], 3.0, 1e-6);
  EXPECT_NEAR(row[2], -0.75, 1e-6);
}

TEST(Quantize, BlockScaleLayoutIsWeightScaleInv) {
  // [E=2, N=200, K=300] -> scales [2, 2, 3]; a spike in expert 1, row block 1, column block 2
  // must land in scale index (1 × 2 + 1) × 3 + 2 = 11.
  const int experts = 2, rows = 200, cols = 300;
  std::vector<std::uint16_t> weights(std::size_t(experts) * rows * cols, float_to_bf16(0.25f));
  weights[(std::size_t(1) * rows + 150) * cols + 290] = float_to_bf16(896.0f);
  const QuantizedWeights q = quantize_weights(QuantScheme::kBlock128, weights.data(), experts, rows, cols);
  ASSERT_EQ(q.scales.size(), 12u);
  for (std::size_t i = 0; i < q.scales.size(); ++i)
    EXPECT_FLOAT_EQ(q.scales[i], i == 11 ? 2.0f : 0.25f / 448.0f) << "scale index " << i;
}

TEST(Quantize, PerTensorOneScalePerExpert) {
  std::vector<std::uint16_t> weights(2 * 4 * 4, float_to_bf16(1.0f));
  weights[20] = float_to_bf16(-44.75f);  // exact in bf16
  const QuantizedWeights q = quantize_weights(QuantScheme::kPerTensor, weights.data(), 2, 4, 4);
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_FLOAT_EQ(q.scales[0], 1.0f / 448.0f);
  EXPECT_FLOAT_EQ(q.scales[1], 44.75f / 448.0f);
}

TEST(Quantize, AllZeroGroupGetsSafeScaleAndZeros) {
  std::vector<std::uint16_t> weights(2 * 128 * 128, 0);
  for (std::size_t i = 128 * 128; i < weights.size(); ++i) weights[i] = float_to_bf16(1.0f);
  const QuantizedWeights q = quantize_weights(QuantScheme::kBlock128, weights.data(), 2, 128, 128);
  EXPECT_TRUE(std::isfinite(q.scales[0]) && q.scales[0] > 0.0f) << "scale " << q.scales[0];
  for (std::size_t i = 0; i < 128 * 128; ++i) ASSERT_EQ(q.values[i], 0x00) << "element " << i;

  const std::vector<double> zeros(256, 0.0);
  for (QuantScheme scheme : {QuantScheme::kPerTensor, QuantScheme::kPerChannelPerToken, QuantScheme::kBlock128}) {
    for (double v : fake_quantize_activations(scheme, zeros.data(), 2, 128)) ASSERT_EQ(v, 0.0) << to_string(scheme);
  }
}

TEST(Quantize, StaticScaleSaturatesInsteadOfOverflowing) {
  const double rows[] = {1e30, -1e30, 1.0, 0.0};
  Fp8Options options;
  options.static_act_scale = true;
  options.act_scale = 0.5f;
  const std::vector<double> q = fake_quantize_activations(QuantScheme::kPerTensor, rows, 1, 4, options);
  EXPECT_EQ(q[0], 224.0);
  EXPECT_EQ(q[1], -224.0);
  EXPECT_EQ(q[2], 1.0);
  EXPECT_EQ(q[3], 0.0);
}

TEST(Quantize, Ue8m0ScalesArePowersOfTwoCoveringTheGroup) {
  std::mt19937 rng(11);
  const int rows = 256, cols = 384;
  const std::vector<std::uint16_t> weights = random_bf16(std::size_t(rows) * cols, 0.3f, rng);
  Fp8Options options;
  options.ue8m0_scales = true;
  const QuantizedWeights q = quantize_weights(QuantScheme::kBlock128, weights.data(), 1, rows, cols, options);
  ASSERT_EQ(q.scales.size(), 6u);
  for (int block = 0; block < 6; ++block) {
    const int row_block = block / 3, col_block = block % 3;
    float amax = 0.0f;
    for (int r = row_block * 128; r < row_block * 128 + 128; ++r)
      for (int c = col_block * 128; c < col_block * 128 + 128; ++c)
        amax = std::max(amax, std::fabs(bf16_to_float(weights[r * cols + c])));
    int exponent = 0;
    EXPECT_EQ(std::frexp(q.scales[block], &exponent), 0.5f) << "scale " << q.scales[block];
    EXPECT_GE(q.scales[block] * kE4m3Max, amax) << "block " << block;
    EXPECT_LT(q.scales[block] * kE4m3Max, 2 * amax) << "block " << block << ": not the smallest power";
  }
}

TEST(Quantize, ActivationGranularity) {
  // One row: columns 0..127 are 1.0, 128..255 are 1000. Block groups keep 1.0 exact; a per-token
  // scale (1000/448) cannot represent it (nearest is 0.4375 × scale ≈ 0.977).
  std::vector<double> row(256, 1.0);
  for (int c = 128; c < 256; ++c) row[c] = 1000.0;
  const std::vector<double> block = fake_quantize_activations(QuantScheme::kBlock128, row.data(), 1, 256);
  const std::vector<double> token = fake_quantize_activations(QuantScheme::kPerChannelPerToken, row.data(), 1, 256);
  std::printf("1.0 dequantised: block groups %.6f, per token %.6f\n", block[0], token[0]);
  EXPECT_NEAR(block[0], 1.0, 1e-6);
  EXPECT_NEAR(block[200], 1000.0, 1e-3);
  EXPECT_NEAR(token[0], 0.4375 * 1000.0 / 448.0, 1e-5);

  // Per-token rows are independent; a dynamic per-tensor scale is shared.
  const double two_rows[] = {1.0, 1.0, 1000.0, 1000.0};
  const std::vector<double> per_token = fake_quantize_activations(QuantScheme::kPerChannelPerToken, two_rows, 2, 2);
  const std::vector<double> per_tensor = fake_quantize_activations(QuantScheme::kPerTensor, two_rows, 2, 2);
  EXPECT_NEAR(per_token[0], 1.0, 1e-6);
  EXPECT_NEAR(per_tensor[0], 0.4375 * 1000.0 / 448.0, 1e-5);
}

// ---- The layer -------------------------------------------------------------------------------

MoeSpec tiny_spec(int experts, int top_k, int hidden, int intermediate) {
  MoeSpec spec = softmax_spec(experts, top_k, true);
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  return spec;
}

TEST(Layer, HandWorkedTwoByTwo) {
  // x = [1, 2]; expert 1: gate = I·x = [1, 2], up = [[1, 1], [0, -1]]·x = [3, -2],
  // act = [3 silu(1), -2 silu(2)], W2 = [[1, 0], [1, 1]]; routed with weight 0.5. Expert 0 is
  // all zeros except where it would show up if chosen by mistake.
  const MoeSpec spec = tiny_spec(2, 1, 2, 2);
  const auto b = [](float v) { return float_to_bf16(v); };
  const std::vector<std::uint16_t> x = {b(1), b(2)};
  const std::vector<std::uint16_t> w13 = {b(9), b(9), b(9), b(9), b(9), b(9), b(9), b(9),
                                          b(1), b(0), b(0), b(1), b(1), b(1), b(0), b(-1)};
  const std::vector<std::uint16_t> w2 = {b(9), b(9), b(9), b(9), b(1), b(0), b(1), b(1)};
  Routing routing;
  routing.num_tokens = 1;
  routing.top_k = 1;
  routing.ids = {1};
  routing.weights = {0.5f};
  const std::vector<double> out = moe_layer(spec, Bf16Layer{x.data(), w13.data(), w2.data()}, routing, {0});
  const double act0 = 3 * silu(1.0), act1 = -2 * silu(2.0);
  std::printf("out = [%.10f, %.10f], expected [%.10f, %.10f]\n", out[0], out[1], 0.5 * act0, 0.5 * (act0 + act1));
  EXPECT_NEAR(out[0], 0.5 * act0, 1e-12);
  EXPECT_NEAR(out[1], 0.5 * (act0 + act1), 1e-12);
}

// Straight from the formula, one token and slot at a time. The operands come through loaders so the
// same loop checks the FP8 layer: loaders return the (de)quantised rows, requantize the intermediate.
using RowLoader = std::function<std::vector<double>(int matrix, int row)>;
using Requantize = std::function<std::vector<double>(const std::vector<double>&)>;

std::vector<double> naive_layer(const MoeSpec& spec, const Routing& routing, const std::vector<int>& tokens,
                                const RowLoader& x_row, const RowLoader& w13_row, const RowLoader& w2_row,
                                const Requantize& requantize) {
  const int H = spec.hidden, I = spec.intermediate;
  std::vector<double> out(tokens.size() * H, 0.0);
  for (std::size_t s = 0; s < tokens.size(); ++s) {
    const std::vector<double> x = x_row(0, tokens[s]);
    for (int j = 0; j < routing.top_k; ++j) {
      const int e = routing.ids[tokens[s] * routing.top_k + j];
      if (e < 0 || e >= spec.num_experts) continue;
      std::vector<double> act(I);
      for (int i = 0; i < I; ++i) {
        const std::vector<double> gate_row = w13_row(e, i), up_row = w13_row(e, I + i);
        double gate = 0, up = 0;
        for (int h = 0; h < H; ++h) {
          gate += gate_row[h] * x[h];
          up += up_row[h] * x[h];
        }
        act[i] = silu(gate) * up;
      }
      act = requantize(act);
      for (int h = 0; h < H; ++h) {
        const std::vector<double> down_row = w2_row(e, h);
        double y = 0;
        for (int i = 0; i < I; ++i) y += down_row[i] * act[i];
        out[s * H + h] += routing.weights[tokens[s] * routing.top_k + j] * y;
      }
    }
  }
  return out;
}

std::vector<double> naive_layer(const MoeSpec& spec, const Bf16Layer& layer, const Routing& routing,
                                const std::vector<int>& tokens) {
  const auto bf16_loader = [](const std::uint16_t* matrices, int rows, int cols) -> RowLoader {
    return [=](int matrix, int row) {
      std::vector<double> values(cols);
      for (int c = 0; c < cols; ++c) values[c] = bf16_to_float(matrices[(std::size_t(matrix) * rows + row) * cols + c]);
      return values;
    };
  };
  const int H = spec.hidden, I = spec.intermediate;
  return naive_layer(spec, routing, tokens, bf16_loader(layer.x, routing.num_tokens, H),
                     bf16_loader(layer.w13, 2 * I, H), bf16_loader(layer.w2, H, I),
                     [](const std::vector<double>& act) { return act; });
}

struct RandomLayer {
  MoeSpec spec;
  std::vector<std::uint16_t> x, w13, w2;
  Routing routing;
  Bf16Layer layer() const { return {x.data(), w13.data(), w2.data()}; }
};

RandomLayer random_layer(const MoeSpec& spec, int tokens, unsigned seed) {
  std::mt19937 rng(seed);
  RandomLayer random{spec, {}, {}, {}, {}};
  const std::size_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate;
  random.x = random_bf16(tokens * H, 1.0f, rng);
  random.w13 = random_bf16(E * 2 * I * H, 1.0f / std::sqrt(float(H)), rng);
  random.w2 = random_bf16(E * H * I, 1.0f / std::sqrt(float(I)), rng);
  std::vector<float> logits(tokens * E);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& l : logits) l = normal(rng);
  random.routing = route(spec, logits.data(), tokens);
  return random;
}

TEST(Layer, MatchesNaiveFormulaOnOddSizes) {
  // 13 tokens × top-3 over 5 experts: expert groups of sizes that do not fill the token blocks.
  const RandomLayer random = random_layer(tiny_spec(5, 3, 37, 19), 13, 1);
  const std::vector<int> tokens = first_tokens(13);
  const std::vector<double> expected = naive_layer(random.spec, random.layer(), random.routing, tokens);
  for (int threads : {1, 3}) {
    const std::vector<double> out = moe_layer(random.spec, random.layer(), random.routing, tokens, threads);
    const double error = relative_error(expected.data(), out.data(), out.size());
    std::printf("threads %d: relative error vs naive %.3g\n", threads, error);
    EXPECT_LT(error, 1e-13);
  }
}

TEST(Layer, SampledTokensAndInvalidIds) {
  RandomLayer random = random_layer(tiny_spec(4, 2, 16, 8), 6, 2);
  const std::vector<double> all = moe_layer(random.spec, random.layer(), random.routing, first_tokens(6));
  const std::vector<double> sampled = moe_layer(random.spec, random.layer(), random.routing, {4, 1});
  for (int h = 0; h < 16; ++h) {
    EXPECT_EQ(sampled[h], all[4 * 16 + h]);
    EXPECT_EQ(sampled[16 + h], all[16 + h]);
  }

  // Token 1 keeps one valid slot; token 2 has none and must come out exactly zero.
  const int kept = random.routing.ids[1 * 2 + 1];
  random.routing.ids[1 * 2 + 0] = -1;
  random.routing.ids[2 * 2 + 0] = 4;
  random.routing.ids[2 * 2 + 1] = 1 << 20;
  Routing only_kept = random.routing;
  only_kept.ids = {kept, kept};
  only_kept.weights = {random.routing.weights[3], 0.0f};
  only_kept.num_tokens = 1;
  const std::vector<double> with_invalid = moe_layer(random.spec, random.layer(), random.routing, {1, 2});
  const std::vector<double> expected = naive_layer(random.spec, random.layer(), random.routing, {1});
  for (int h = 0; h < 16; ++h) {
    EXPECT_NEAR(with_invalid[h], expected[h], 1e-12);
    EXPECT_EQ(with_invalid[16 + h], 0.0);
  }
  EXPECT_THROW(moe_layer(random.spec, random.layer(), random.routing, {6}), Error);
}

struct Fp8Case {
  QuantScheme scheme;
  bool ue8m0;
  bool static_scales;
};

TEST(Layer, Fp8SchemesAgreeWithBf16AndSampleConsistently) {
  MoeSpec spec = tiny_spec(4, 2, 256, 192);
  spec.weight_dtype = WeightDType::kFP8E4M3;
  const RandomLayer random = random_layer(spec, 24, 5);
  const std::vector<int> tokens = first_tokens(24);
  const std::vector<double> exact = moe_layer(spec, random.layer(), random.routing, tokens);
  const Fp8Case cases[] = {{QuantScheme::kPerTensor, false, false},
                           {QuantScheme::kPerTensor, false, true},
                           {QuantScheme::kPerChannelPerToken, false, false},
                           {QuantScheme::kBlock128, false, false},
                           {QuantScheme::kBlock128, true, false}};
  for (const Fp8Case& c : cases) {
    spec.scheme = c.scheme;
    Fp8Layer layer;
    layer.options.ue8m0_scales = c.ue8m0;
    layer.options.static_act_scale = c.static_scales;
    // Static scales near what the dynamic ones come to for these inputs (x ~ N(0, 1)).
    layer.options.act_scale = 5.0f / 448.0f;
    layer.options.intermediate_act_scale = 12.0f / 448.0f;
    const QuantizedWeights w13 = quantize_weights(c.scheme, random.w13.data(), 4, 2 * 192, 256, layer.options);
    const QuantizedWeights w2 = quantize_weights(c.scheme, random.w2.data(), 4, 256, 192, layer.options);
    layer.x = random.x.data();
    layer.w13 = &w13;
    layer.w2 = &w2;
    const std::vector<double> out = moe_layer(spec, layer, random.routing, tokens);
    const double error = relative_error(exact.data(), out.data(), out.size());
    std::printf("%s%s%s: relative error vs the unquantised layer %.4f\n", to_string(c.scheme).c_str(),
                c.ue8m0 ? " ue8m0" : "", c.static_scales ? " static" : "", error);
    EXPECT_GT(error, 1e-4) << "quantisation must show";
    EXPECT_LT(error, 0.1);

    // A sampled token sees the same scales as in the full run (dynamic per-tensor included).
    const std::vector<double> sampled = moe_layer(spec, layer, random.routing, {17});
    for (int h = 0; h < 256; ++h) ASSERT_EQ(sampled[h], out[17 * 256 + h]) << to_string(c.scheme);
  }
}

TEST(Layer, Fp8MatchesNaiveCompositionOfTheQuantisers) {
  // Per token (one scale per x row and per slot's intermediate row), block (two 1×128 groups
  // along H = 256), and static per-tensor: x quantised once per token, the SwiGLU output per slot
  // after rounding to bf16.
  MoeSpec spec = tiny_spec(3, 2, 256, 136);
  spec.weight_dtype = WeightDType::kFP8E4M3;
  const RandomLayer random = random_layer(spec, 5, 8);
  for (const Fp8Case c : {Fp8Case{QuantScheme::kPerChannelPerToken, false, false},
                          Fp8Case{QuantScheme::kBlock128, true, false},
                          Fp8Case{QuantScheme::kPerTensor, false, true}}) {
    spec.scheme = c.scheme;
    Fp8Options options;
    options.ue8m0_scales = c.ue8m0;
    options.static_act_scale = c.static_scales;
    options.act_scale = 5.0f / 448.0f;
    options.intermediate_act_scale = 12.0f / 448.0f;
    const QuantizedWeights w13 = quantize_weights(c.scheme, random.w13.data(), 3, 2 * 136, 256, options);
    const QuantizedWeights w2 = quantize_weights(c.scheme, random.w2.data(), 3, 256, 136, options);
    const auto x_row = [&](int, int token) {
      std::vector<double> row(256);
      for (int h = 0; h < 256; ++h) row[h] = bf16_to_float(random.x[token * 256 + h]);
      return fake_quantize_activations(c.scheme, row.data(), 1, 256, options);
    };
    const auto dequantized = [](const QuantizedWeights& weights) -> RowLoader {
      return [&weights](int expert, int row) {
        std::vector<double> values(weights.cols);
        dequantize_weight_row(weights, expert, row, values.data());
        return values;
      };
    };
    Fp8Options intermediate_options = options;
    intermediate_options.act_scale = options.intermediate_act_scale;
    // The SwiGLU output is stored as bf16 between the GEMMs, then quantised.
    const auto requantize = [&](const std::vector<double>& act) {
      std::vector<double> stored(act.size());
      for (std::size_t i = 0; i < act.size(); ++i) stored[i] = bf16_to_float(float_to_bf16(static_cast<float>(act[i])));
      return fake_quantize_activations(c.scheme, stored.data(), 1, 136, intermediate_options);
    };
    const std::vector<int> tokens = first_tokens(5);
    const std::vector<double> expected =
        naive_layer(spec, random.routing, tokens, x_row, dequantized(w13), dequantized(w2), requantize);
    const std::vector<double> out =
        moe_layer(spec, Fp8Layer{random.x.data(), &w13, &w2, options}, random.routing, tokens);
    const double error = relative_error(expected.data(), out.data(), out.size());
    std::printf("%s: relative error vs the naive composition %.3g\n", to_string(c.scheme).c_str(), error);
    EXPECT_LT(error, 1e-12);
  }
}

TEST(Layer, Fp8RejectsMismatchedWeights) {
  MoeSpec spec = tiny_spec(2, 1, 8, 4);
  spec.weight_dtype = WeightDType::kFP8E4M3;
  spec.scheme = QuantScheme::kBlock128;
  const RandomLayer random = random_layer(spec, 2, 9);
  const QuantizedWeights w13 = quantize_weights(QuantScheme::kBlock128, random.w13.data(), 2, 8, 8);
  const QuantizedWeights w2 = quantize_weights(QuantScheme::kPerTensor, random.w2.data(), 2, 8, 4);
  Fp8Layer layer{random.x.data(), &w13, &w2, {}};
  EXPECT_THROW(moe_layer(spec, layer, random.routing, {0}), Error);
}

}  // namespace
}  // namespace hmoe::reference
