// The FP8 path (DESIGN.md §2, issue 4): weight quantisation bit-exact with the CPU reference, every
// scheme × preset against the quantisation-emulating reference (≤ 2e-2), edge values (saturation,
// all-zero rows), and CUDA-graph replays with new inputs — also at every T of the bench sweep.
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_support.hpp"
#include "reference/reference.hpp"
#include "testkit/check.hpp"
#include "testkit/random_inputs.hpp"

namespace hmoe::test {
namespace {

using testkit::Entry;
using testkit::RoutingMode;

MoeSpec fp8_spec(const std::string& preset_name, QuantScheme scheme, bool ue8m0 = false) {
  MoeSpec spec = preset(preset_name);
  spec.weight_dtype = WeightDType::kFP8E4M3;
  spec.scheme = scheme;
  spec.ue8m0_scales = ue8m0;
  return spec;
}

std::string describe(const testkit::CheckResult& result) {
  return "plan " + to_string(result.plan.orientation) + " " + std::to_string(result.plan.weight_tile) + "x" +
         std::to_string(result.plan.token_tile) + " (" + result.plan.gemm1_kernel + ") rel_err " +
         std::to_string(result.rel_error) + " (vs bf16 layer " + std::to_string(result.rel_error_unquantised) +
         ") over " + std::to_string(result.tokens_checked) + "/" + std::to_string(result.num_tokens) +
         " tokens, unwritten " + std::to_string(result.unwritten) + ", nonfinite " + std::to_string(result.nonfinite);
}

void expect_passes(const testkit::CheckResult& result, const std::string& context) {
  const std::string summary = context + ": " + describe(result);
  std::cout << "  " << summary << "\n";
  EXPECT_EQ(result.unwritten, 0u) << summary;
  EXPECT_EQ(result.nonfinite, 0u) << summary;
  EXPECT_EQ(result.tolerance, testkit::kFp8Tolerance) << summary;
  EXPECT_LE(result.rel_error, result.tolerance) << summary;
}

// ---- quantize_weights ---------------------------------------------------------------------------

// Bit for bit what the reference computes: same scales, same e4m3 bytes, with and without UE8M0,
// including all-zero groups (scale 1) and values that round exactly half-way between e4m3 steps.
TEST(Fp8QuantizeWeights, MatchesTheReferenceBitForBit) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream;
  for (QuantScheme scheme : {QuantScheme::kPerTensor, QuantScheme::kPerChannelPerToken, QuantScheme::kBlock128}) {
    for (bool ue8m0 : {false, true}) {
      MoeSpec spec = fp8_spec("qwen3-30b-a3b", scheme, ue8m0);
      spec.num_experts = 3;
      spec.top_k = 2;
      spec.hidden = 384;
      spec.intermediate = 256;
      for (WeightMatrix matrix : {WeightMatrix::kW13, WeightMatrix::kW2}) {
        const int rows = matrix == WeightMatrix::kW13 ? 2 * spec.intermediate : spec.hidden;
        const int cols = matrix == WeightMatrix::kW13 ? spec.hidden : spec.intermediate;
        const std::size_t count = static_cast<std::size_t>(spec.num_experts) * rows * cols;
        testkit::DeviceBuffer bf16(count * 2);
        testkit::fill_uniform_bf16(bf16.as<std::uint16_t>(), count, 0.37f, 11, 3, stream.get());
        // Expert 1: its first 128 rows all zero (a zero block and zero channels); one huge value.
        std::vector<std::uint16_t> host = testkit::copy_to_host<std::uint16_t>(bf16.get(), count, stream.get());
        std::fill(host.begin() + static_cast<std::size_t>(rows) * cols,
                  host.begin() + static_cast<std::size_t>(rows) * cols + 128 * cols, 0);
        host[5] = reference::float_to_bf16(-3.0e4f);
        HMOE_CUDA_CHECK(cudaMemcpy(bf16.get(), host.data(), count * 2, cudaMemcpyHostToDevice));
        testkit::DeviceBuffer values(count);
        testkit::DeviceBuffer scales(weight_scale_count(spec, matrix) * sizeof(float));
        quantize_weights(spec, matrix, bf16.get(), values.get(), scales.as<float>(), stream.get());
        const auto gpu_values = testkit::copy_to_host<std::uint8_t>(values.get(), count, stream.get());
        const auto gpu_scales = testkit::copy_to_host<float>(scales.get(), weight_scale_count(spec, matrix), stream.get());
        reference::Fp8Options options;
        options.ue8m0_scales = ue8m0;
        const reference::QuantizedWeights expected =
            reference::quantize_weights(scheme, host.data(), spec.num_experts, rows, cols, options);
        const std::string context = to_string(scheme) + (ue8m0 ? " ue8m0 " : " ") +
                                    (matrix == WeightMatrix::kW13 ? "w13" : "w2");
        ASSERT_EQ(gpu_scales.size(), expected.scales.size()) << context;
        EXPECT_EQ(std::memcmp(gpu_scales.data(), expected.scales.data(), gpu_scales.size() * 4), 0) << context;
        std::size_t mismatches = 0;
        for (std::size_t i = 0; i < count; ++i) mismatches += gpu_values[i] != expected.values[i];
        EXPECT_EQ(mismatches, 0u) << context << ": e4m3 bytes differ from the reference";
      }
    }
  }
}

// ---- The layer against the quantisation-emulating reference -------------------------------------

struct Fp8Case {
  std::string preset_name;
  QuantScheme scheme;
  int num_tokens = 0;
  Orientation orientation = Orientation::kAuto;
  RoutingMode routing = RoutingMode::kUniform;
  Entry entry = Entry::kLogits;
  bool static_scales = false;
};

std::vector<Fp8Case> fp8_cases() {
  std::vector<Fp8Case> cases;
  for (const std::string& name : preset_names()) {
    for (QuantScheme scheme : {QuantScheme::kPerTensor, QuantScheme::kPerChannelPerToken, QuantScheme::kBlock128}) {
      if (scheme == QuantScheme::kBlock128 && preset(name).intermediate % 128 != 0) continue;
      for (int tokens : {1, 7, 64, 1000}) cases.push_back({name, scheme, tokens});
      for (Orientation orientation : {Orientation::kNormal, Orientation::kSwapAB})
        for (int tokens : {7, 64}) cases.push_back({name, scheme, tokens, orientation});
      cases.push_back({name, scheme, 1000, Orientation::kAuto, RoutingMode::kExtreme});
      cases.push_back({name, scheme, 64, Orientation::kAuto, RoutingMode::kZipf, Entry::kTopK});
    }
    for (int tokens : {1, 64, 1000})
      cases.push_back({name, QuantScheme::kPerTensor, tokens, Orientation::kAuto, RoutingMode::kUniform, Entry::kLogits, true});
  }
  return cases;
}

void PrintTo(const Fp8Case& c, std::ostream* os) {
  *os << c.preset_name << " " << to_string(c.scheme) << (c.static_scales ? "(static)" : "") << " T=" << c.num_tokens
      << " " << to_string(c.orientation) << " " << testkit::to_string(c.routing) << " " << testkit::to_string(c.entry);
}

std::string fp8_case_name(const testing::TestParamInfo<Fp8Case>& info) {
  const Fp8Case& c = info.param;
  std::string name = c.preset_name + "_" + to_string(c.scheme) + (c.static_scales ? "_static" : "") + "_T" +
                     std::to_string(c.num_tokens) + "_" + to_string(c.orientation) + "_" +
                     testkit::to_string(c.routing) + "_" + testkit::to_string(c.entry);
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

class Fp8LayerTest : public testing::TestWithParam<Fp8Case> {};

TEST_P(Fp8LayerTest, MatchesQuantisedReference) {
  HMOE_REQUIRE_HOPPER_GPU();
  const Fp8Case& c = GetParam();
  const testkit::LayerWeights& weights = cached_fp8_weights(c.preset_name, c.scheme, c.static_scales);
  testkit::CheckOptions options;
  options.num_tokens = c.num_tokens;
  options.routing = c.routing;
  options.entry = c.entry;
  options.orientation = c.orientation;
  options.seed = 300 + c.num_tokens;
  options.static_act_scales = c.static_scales;
  options.max_reference_tokens = reference_token_budget(weights.spec) / 2;   // two references per case
  const testkit::CheckResult result = testkit::check_layer(weights, options);
  expect_passes(result, fp8_case_name({c, 0}));
  if (c.orientation != Orientation::kAuto) EXPECT_EQ(result.plan.orientation, c.orientation);
  EXPECT_NE(result.plan.gemm1_kernel.find("_fp8"), std::string::npos) << result.plan.gemm1_kernel;
}

INSTANTIATE_TEST_SUITE_P(Schemes, Fp8LayerTest, testing::ValuesIn(fp8_cases()), fp8_case_name);

// The split along K (PlanOptions::split_k) in every FP8 scheme: split ranges promote their own K
// blocks with the right block scales (absolute K-block indices), epilogue scales apply once to the sum.
TEST(Fp8SplitK, EverySchemeMatchesTheQuantisedReference) {
  HMOE_REQUIRE_HOPPER_GPU();
  for (const char* preset_name : {"deepseek-v3-tp8", "qwen3-30b-a3b"}) {
    for (QuantScheme scheme : {QuantScheme::kPerTensor, QuantScheme::kPerChannelPerToken, QuantScheme::kBlock128}) {
      const testkit::LayerWeights& weights = cached_fp8_weights(preset_name, scheme);
      for (int num_tokens : {1, 2}) {
        for (int split_k : {0, 2, 5}) {
          testkit::CheckOptions options;
          options.num_tokens = num_tokens;
          options.seed = 700 + num_tokens;
          options.split_k = split_k;
          const testkit::CheckResult result = testkit::check_layer(weights, options);
          const std::string context = std::string(preset_name) + " " + to_string(scheme) + " T=" +
                                      std::to_string(num_tokens) + " split_k " + std::to_string(split_k) + " (GEMM1 in " +
                                      std::to_string(result.plan.gemm1_splits) + ")";
          expect_passes(result, context);
          if (split_k > 1) EXPECT_GT(result.plan.gemm1_splits, 1) << context;
        }
      }
    }
  }
}

// `hmoe tune` checks fp8-tensor buckets above 6 tokens with static activation scales on weights
// made with dynamic ones (testkit::set_static_act_scales): each way the runs read the scales the
// flag says (RunArgs.act_scale set only when static) and match the reference that follows the flag,
// and switching back restores the dynamic path.
TEST(Fp8ActScales, SwitchingStaticAndDynamicKeepsRunAndReferenceInStep) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream;
  testkit::LayerWeights weights = testkit::make_layer_weights(fp8_spec("qwen3-30b-a3b", QuantScheme::kPerTensor),
                                                              /*seed=*/31, /*keep_host_copy=*/true, stream.get());
  for (bool static_scales : {true, false, true, false}) {
    testkit::set_static_act_scales(weights, static_scales, stream.get());
    const testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, 7, Entry::kLogits, {RoutingMode::kUniform, 33, 34}, stream.get());
    const RunArgs args = testkit::run_args(weights, inputs, nullptr);
    EXPECT_EQ(args.act_scale != nullptr, static_scales);
    EXPECT_EQ(args.intermediate_act_scale != nullptr, static_scales);
    EXPECT_EQ(weights.fp8_options().static_act_scale, static_scales);
    for (int num_tokens : {7, 1000}) {
      testkit::CheckOptions options;
      options.num_tokens = num_tokens;
      options.seed = 35 + num_tokens;
      options.max_reference_tokens = 16;
      const testkit::CheckResult result = testkit::check_layer(weights, options);
      expect_passes(result, std::string(static_scales ? "static" : "dynamic") + " scales T=" + std::to_string(num_tokens));
    }
  }
}

// ---- Edge values ---------------------------------------------------------------------------------

// One token of huge values (|x| far above 448 × any static scale: saturates, never Inf/NaN) and one
// all-zero token (a safe scale: its output is exactly zero), among ordinary tokens.
TEST(Fp8EdgeValues, SaturationAndAllZeroRows) {
  HMOE_REQUIRE_HOPPER_GPU();
  const struct {
    QuantScheme scheme;
    bool static_scales;
  } cases[] = {{QuantScheme::kPerTensor, false}, {QuantScheme::kPerTensor, true},
               {QuantScheme::kPerChannelPerToken, false}, {QuantScheme::kBlock128, false}};
  for (const auto& [scheme, static_scales] : cases) {
    const testkit::LayerWeights& weights = cached_fp8_weights("qwen3-30b-a3b", scheme, static_scales);
    const MoeSpec& spec = weights.spec;
    const std::string context = to_string(scheme) + (static_scales ? "(static)" : "");
    const testkit::Stream stream;
    const int num_tokens = 7, zero_token = 2, huge_token = 4;
    testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, num_tokens, Entry::kTopK, {RoutingMode::kUniform, 1, 77}, stream.get());
    const std::size_t count = static_cast<std::size_t>(num_tokens) * spec.hidden;
    std::vector<std::uint16_t> x = testkit::copy_to_host<std::uint16_t>(inputs.x.get(), count, stream.get());
    for (int h = 0; h < spec.hidden; ++h) {
      x[zero_token * spec.hidden + h] = 0;
      x[huge_token * spec.hidden + h] = reference::float_to_bf16((h % 2 ? 1.0f : -1.0f) * (1.0e4f + 37.0f * h));
    }
    HMOE_CUDA_CHECK(cudaMemcpy(inputs.x.get(), x.data(), count * 2, cudaMemcpyHostToDevice));

    PlanOptions plan_options;
    plan_options.max_tokens = num_tokens;
    const MoeRunner runner(spec, plan_options);
    testkit::DeviceBuffer workspace(runner.workspace_bytes());
    testkit::DeviceBuffer out(count * 2);
    testkit::poison_bf16(out.get(), count, stream.get());
    RunArgs args = testkit::run_args(weights, inputs, out.get());
    args.workspace = workspace.get();
    args.workspace_size = workspace.bytes();
    testkit::run_layer(runner, args, inputs, stream.get());
    stream.synchronize();
    const std::vector<std::uint16_t> out_host = testkit::copy_to_host<std::uint16_t>(out.get(), count, stream.get());
    const testkit::CheckResult result = testkit::compare_with_reference(
        weights, x, testkit::host_routing(weights, inputs, stream.get()), out_host, num_tokens, 1);
    expect_passes(result, context + " with a huge and a zero token");
    for (int h = 0; h < spec.hidden; ++h)
      ASSERT_EQ(out_host[zero_token * spec.hidden + h] & 0x7FFF, 0) << context << ": the all-zero token's output at " << h;
  }
}

// ---- CUDA graphs ---------------------------------------------------------------------------------

// Captures run_from_logits once per T, then replays it on two fresh input sets and checks each
// against the reference: the captured FP8 quantisation passes see the new values.
void expect_graph_replays_match(const testkit::LayerWeights& weights, const std::vector<int>& token_counts,
                                const std::string& label, bool fused_decode = false) {
  const MoeSpec& spec = weights.spec;
  for (int num_tokens : token_counts) {
    const testkit::Stream stream;
    testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, num_tokens, Entry::kLogits, {RoutingMode::kUniform, 1, 5}, stream.get());
    PlanOptions plan_options;
    plan_options.max_tokens = num_tokens;
    plan_options.fused_decode = fused_decode ? FusedDecode::kOn : FusedDecode::kOff;
    const MoeRunner runner(spec, plan_options);
    if (fused_decode) EXPECT_TRUE(runner.plan_info(num_tokens).fused_decode) << label << " T=" << num_tokens;
    testkit::DeviceBuffer workspace(runner.workspace_bytes());
    const std::size_t count = static_cast<std::size_t>(num_tokens) * spec.hidden;
    testkit::DeviceBuffer out(count * 2);
    RunArgs args = testkit::run_args(weights, inputs, out.get());
    args.workspace = workspace.get();
    args.workspace_size = workspace.bytes();
    const testkit::GraphExec graph =
        testkit::GraphExec::capture(stream.get(), [&] { testkit::run_layer(runner, args, inputs, stream.get()); });
    std::vector<std::uint16_t> previous;
    for (std::uint64_t seed : {6, 7}) {
      testkit::fill_layer_inputs(inputs, weights, {RoutingMode::kUniform, 1, seed}, stream.get());
      testkit::poison_bf16(out.get(), count, stream.get());
      graph.launch(stream.get());
      stream.synchronize();
      const std::vector<std::uint16_t> out_host = testkit::copy_to_host<std::uint16_t>(out.get(), count, stream.get());
      const std::vector<std::uint16_t> x_host = testkit::copy_to_host<std::uint16_t>(inputs.x.get(), count, stream.get());
      const testkit::CheckResult result = testkit::compare_with_reference(
          weights, x_host, testkit::host_routing(weights, inputs, stream.get()), out_host,
          std::max(2, reference_token_budget(spec) / 4), seed);
      const std::string context = label + " T=" + std::to_string(num_tokens) + " replay seed " + std::to_string(seed);
      EXPECT_EQ(result.unwritten, 0u) << context;
      EXPECT_EQ(result.nonfinite, 0u) << context;
      EXPECT_LE(result.rel_error, result.tolerance) << context << ": rel_err " << result.rel_error;
      EXPECT_NE(out_host, previous) << context << ": the replay ignored the new inputs";
      previous = out_host;
    }
    std::cout << "  " << label << " T=" << num_tokens << ": graph replays match the reference\n";
  }
}

TEST(Fp8Graphs, EverySchemeReplaysWithNewInputs) {
  HMOE_REQUIRE_HOPPER_GPU();
  expect_graph_replays_match(cached_fp8_weights("qwen3-30b-a3b", QuantScheme::kPerTensor), {1, 64}, "fp8-tensor");
  expect_graph_replays_match(cached_fp8_weights("qwen3-30b-a3b", QuantScheme::kPerTensor, true), {64}, "fp8-tensor(static)");
  expect_graph_replays_match(cached_fp8_weights("deepseek-v3-tp8", QuantScheme::kPerChannelPerToken), {1, 64}, "fp8-channel");
  expect_graph_replays_match(cached_fp8_weights("deepseek-v3-tp8", QuantScheme::kBlock128), {1, 64}, "fp8-block");
}

// Every token count of the default `hmoe bench` sweep, captured and replayed, bf16 and fp8-block
// (issue 5: graph capture/replay at every T of the sweep).
TEST(Graphs, EveryTOfTheBenchSweepBf16AndFp8) {
  HMOE_REQUIRE_HOPPER_GPU();
  const std::vector<int> sweep = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
  expect_graph_replays_match(cached_weights("qwen3-30b-a3b"), sweep, "qwen3-30b-a3b bf16");
  expect_graph_replays_match(cached_fp8_weights("qwen3-30b-a3b", QuantScheme::kBlock128), sweep, "qwen3-30b-a3b fp8-block");
}

// The fused decode layer (PlanOptions::fused_decode, one cooperative kernel) captured and replayed.
TEST(Graphs, FusedDecodeLayerReplaysWithNewInputs) {
  HMOE_REQUIRE_HOPPER_GPU();
  expect_graph_replays_match(cached_weights("qwen3-30b-a3b"), {1, 4}, "qwen3-30b-a3b bf16 fused", true);
  expect_graph_replays_match(cached_fp8_weights("deepseek-v3-tp8", QuantScheme::kBlock128), {1, 3}, "fp8-block fused",
                             true);
}

}  // namespace
}  // namespace hmoe::test
