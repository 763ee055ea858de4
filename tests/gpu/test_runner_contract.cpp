// MoeRunner's promises beyond accuracy: T = 0 touches nothing, out-of-range expert ids are counted
// and contribute nothing, outputs are bit-identical run to run, and captured graphs replay correctly
// with new input values in the same buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "gemm/variants.hpp"
#include "permute/permute.hpp"
#include "routing/routing.hpp"
#include "testkit/check.hpp"

namespace hmoe::test {
namespace {

using testkit::DeviceBuffer;
using testkit::Entry;
using testkit::RoutingMode;

// A runner planned for max_tokens with its workspace and one poisoned-able output.
struct Harness {
  Harness(const testkit::LayerWeights& weights, int max_tokens, Orientation orientation = Orientation::kAuto,
          bool replay_graphs = false, FusedDecode fused_decode = FusedDecode::kOn)
      : runner(weights.spec, plan_options(max_tokens, orientation, replay_graphs, fused_decode)),
        workspace(runner.workspace_bytes()),
        out_count(static_cast<std::size_t>(max_tokens) * weights.spec.hidden),
        out(out_count * sizeof(std::uint16_t)) {}

  static PlanOptions plan_options(int max_tokens, Orientation orientation, bool replay_graphs,
                                  FusedDecode fused_decode) {
    PlanOptions options{max_tokens, orientation, 0, "", replay_graphs};
    options.fused_decode = fused_decode;
    return options;
  }

  RunArgs args(const testkit::LayerWeights& weights, const testkit::LayerInputs& inputs) const {
    RunArgs run_args = testkit::run_args(weights, inputs, out.get());
    run_args.workspace = workspace.get();
    run_args.workspace_size = workspace.bytes();
    return run_args;
  }
  std::vector<std::uint16_t> out_host(cudaStream_t stream) const {
    return testkit::copy_to_host<std::uint16_t>(out.get(), out_count, stream);
  }

  MoeRunner runner;
  DeviceBuffer workspace;
  std::size_t out_count;
  DeviceBuffer out;
};

std::vector<std::uint16_t> x_host(const testkit::LayerWeights& weights, const testkit::LayerInputs& inputs,
                                  cudaStream_t stream) {
  return testkit::copy_to_host<std::uint16_t>(inputs.x.get(),
                                              static_cast<std::size_t>(inputs.num_tokens) * weights.spec.hidden, stream);
}

void expect_matches_reference(const testkit::CheckResult& result, const std::string& what) {
  std::cout << "  " << what << ": rel_err " << result.rel_error << " over " << result.tokens_checked << "/"
            << result.num_tokens << " tokens, unwritten " << result.unwritten << "\n";
  EXPECT_EQ(result.unwritten, 0u) << what;
  EXPECT_EQ(result.nonfinite, 0u) << what;
  EXPECT_LE(result.rel_error, result.tolerance) << what;
}

TEST(RunnerContract, ZeroTokensTouchesNothing) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::LayerWeights& weights = cached_weights("qwen3-30b-a3b");
  const testkit::Stream stream;
  for (Entry entry : {Entry::kLogits, Entry::kTopK}) {
    const testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, 16, entry, {RoutingMode::kUniform, 1, 2}, stream.get());
    const Harness harness(weights, 16);
    testkit::poison_bf16(harness.out.get(), harness.out_count, stream.get());
    RunArgs args = harness.args(weights, inputs);
    args.num_tokens = 0;
    testkit::run_layer(harness.runner, args, inputs, stream.get());
    stream.synchronize();
    for (std::uint16_t bits : harness.out_host(stream.get()))
      ASSERT_EQ(bits, testkit::kPoisonBf16) << "T = 0 wrote the output (entry " << testkit::to_string(entry) << ")";
  }
}

TEST(RunnerContract, OutOfRangeTopkIdsAreCountedAndContributeNothing) {
  HMOE_REQUIRE_HOPPER_GPU();
  for (const char* preset_name : {"qwen3-30b-a3b", "deepseek-v3-tp8", "mixtral-8x7b"}) {
    const testkit::LayerWeights& weights = cached_weights(preset_name);
    const MoeSpec& spec = weights.spec;
    const testkit::Stream stream;
    // Few enough tokens that the reference checks every one of them, Mixtral included.
    const int num_tokens = 6;
    testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, num_tokens, Entry::kTopK, {RoutingMode::kUniform, 1, 3}, stream.get());
    reference::Routing routing = testkit::host_routing(weights, inputs, stream.get());
    const int k = spec.top_k;
    const std::vector<std::pair<int, std::int32_t>> bad_slots = {
        {1 * k + (k - 1), spec.num_experts},  // one past the end, in a token's last slot
        {2 * k, -1},                          // negative, in a token's top slot
        {5 * k + k / 2, std::numeric_limits<std::int32_t>::max()},
        {0, std::numeric_limits<std::int32_t>::min()},
    };
    for (const auto& [slot, id] : bad_slots) routing.ids[slot] = id;
    testkit::copy_to_device(inputs.topk_ids.get(), routing.ids, stream.get());

    const Harness harness(weights, num_tokens);
    DeviceBuffer invalid_count(sizeof(int));
    HMOE_CUDA_CHECK(cudaMemsetAsync(invalid_count.get(), 0, sizeof(int), stream.get()));
    testkit::poison_bf16(harness.out.get(), harness.out_count, stream.get());
    RunArgs args = harness.args(weights, inputs);
    args.invalid_id_count = invalid_count.as<int>();
    testkit::run_layer(harness.runner, args, inputs, stream.get());
    stream.synchronize();

    EXPECT_EQ(testkit::copy_to_host<int>(invalid_count.get(), 1, stream.get())[0], static_cast<int>(bad_slots.size()))
        << preset_name;
    const testkit::CheckResult result = testkit::compare_with_reference(
        weights, x_host(weights, inputs, stream.get()), routing, harness.out_host(stream.get()), num_tokens, 1);
    expect_matches_reference(result, std::string(preset_name) + " with 4 out-of-range ids");
  }
}

TEST(RunnerContract, OutputsAreBitIdenticalAcrossRuns) {
  HMOE_REQUIRE_HOPPER_GPU();
  for (const std::string& preset_name : preset_names()) {
    for (RoutingMode routing : {RoutingMode::kZipf, RoutingMode::kExtreme}) {
      const testkit::LayerWeights& weights = cached_weights(preset_name);
      const testkit::Stream stream;
      const testkit::LayerInputs inputs =
          testkit::make_layer_inputs(weights, 1000, Entry::kLogits, {routing, 1, 4}, stream.get());
      const Harness harness(weights, 1000);
      std::vector<std::uint16_t> outputs[2];
      for (std::vector<std::uint16_t>& output : outputs) {
        testkit::poison_bf16(harness.out.get(), harness.out_count, stream.get());
        testkit::run_layer(harness.runner, harness.args(weights, inputs), inputs, stream.get());
        stream.synchronize();
        output = harness.out_host(stream.get());
      }
      EXPECT_EQ(std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].size() * sizeof(std::uint16_t)), 0)
          << preset_name << " " << testkit::to_string(routing) << ": two runs of the same inputs differ";
    }
  }
}

// Prefill with k > 1 reads each x row once and writes it (bf16) or its e4m3 row and scales (FP8) into
// the token's k sorted rows (permute::scatter_x_rows); HMOE_SCATTER_X=0 keeps the per-row walk. The
// two must give the same bits, for every scheme, with skewed routing and invalid ids (slot_rows −1),
// and match the reference. T = 1100 at k = 8 (8800 pairs) is past the threshold.
TEST(RunnerContract, PerTokenXRowsGiveThePerRowBits) {
  HMOE_REQUIRE_HOPPER_GPU();
  constexpr int kTokens = 1100;
  struct Layer {
    const char* preset_name;
    QuantScheme scheme;   // kNone: bf16
    bool static_scales;
  };
  for (const Layer& layer : {Layer{"qwen3-30b-a3b", QuantScheme::kNone, false},
                             Layer{"olmoe-1b-7b", QuantScheme::kNone, false},
                             Layer{"qwen3-30b-a3b", QuantScheme::kBlock128, false},
                             Layer{"qwen3-30b-a3b", QuantScheme::kPerChannelPerToken, false},
                             Layer{"qwen3-30b-a3b", QuantScheme::kPerTensor, false},
                             Layer{"olmoe-1b-7b", QuantScheme::kPerTensor, true}}) {
    const testkit::LayerWeights& weights = layer.scheme == QuantScheme::kNone
                                               ? cached_weights(layer.preset_name)
                                               : cached_fp8_weights(layer.preset_name, layer.scheme, layer.static_scales);
    const MoeSpec& spec = weights.spec;
    const std::string what = std::string(layer.preset_name) + " " +
                             (layer.scheme == QuantScheme::kNone ? std::string("bf16") : to_string(layer.scheme)) +
                             (layer.static_scales ? " (static)" : "");
    ASSERT_TRUE(permute::scatter_x_rows(kTokens, spec.top_k)) << what;
    const testkit::Stream stream;
    testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, kTokens, Entry::kTopK, {RoutingMode::kZipf, 1, 5}, stream.get());
    reference::Routing routing = testkit::host_routing(weights, inputs, stream.get());
    for (int slot = 3; slot < kTokens * spec.top_k; slot += 997) routing.ids[slot] = slot % 2 == 0 ? -1 : spec.num_experts;
    testkit::copy_to_device(inputs.topk_ids.get(), routing.ids, stream.get());

    std::vector<std::uint16_t> outputs[2];
    for (int per_row = 0; per_row < 2; ++per_row) {
      if (per_row == 1) setenv("HMOE_SCATTER_X", "0", 1);
      EXPECT_EQ(permute::scatter_x_environment(), per_row == 0) << what;
      const Harness harness(weights, kTokens);   // reads HMOE_SCATTER_X
      unsetenv("HMOE_SCATTER_X");
      testkit::poison_bf16(harness.out.get(), harness.out_count, stream.get());
      testkit::run_layer(harness.runner, harness.args(weights, inputs), inputs, stream.get());
      stream.synchronize();
      outputs[per_row] = harness.out_host(stream.get());
    }
    EXPECT_EQ(std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].size() * sizeof(std::uint16_t)), 0)
        << what << ": per-token and per-row x rows differ";
    if (layer.scheme == QuantScheme::kPerTensor && !layer.static_scales) continue;   // (a dynamic per-tensor
    // reference runs GEMM1 on every token in float64; the bits above tie it to the per-row walk)
    const testkit::CheckResult result = testkit::compare_with_reference(
        weights, x_host(weights, inputs, stream.get()), routing, outputs[0], reference_token_budget(spec), 11);
    expect_matches_reference(result, what + " T=1100, per token");
  }
}

// One layer run twice on the same inputs with `pair` forced: GEMM1's fused path (HMOE_FUSED_REQUANT unset)
// and the separate re-quantisation (HMOE_FUSED_REQUANT=0). The inputs: `routing` ids with an invalid one
// (−1 or E) every 1009 slots from slot 5, token `zero_token` all zeros and `huge_token` |x| ~1e4 (−1:
// none). Before each run the workspace is filled with `poison` bytes and the output with NaNs. `check`
// sees each runner (fused first) and may change the run's arguments.
struct FusedAndSeparate {
  std::vector<std::uint16_t> x;
  reference::Routing routing;
  std::vector<std::uint16_t> outputs[2];   // fused, separate
};

FusedAndSeparate run_fused_and_separate(const testkit::LayerWeights& weights, const std::string& pair, int split_k,
                                        int tokens, RoutingMode routing_mode, int zero_token, int huge_token,
                                        int poison, const std::function<void(const MoeRunner&, bool, RunArgs&)>& check) {
  const MoeSpec& spec = weights.spec;
  const testkit::Stream stream;
  FusedAndSeparate run;
  testkit::LayerInputs inputs = testkit::make_layer_inputs(weights, tokens, Entry::kTopK, {routing_mode, 1, 9}, stream.get());
  run.routing = testkit::host_routing(weights, inputs, stream.get());
  for (int slot = 5; slot < tokens * spec.top_k; slot += 1009) run.routing.ids[slot] = slot % 2 == 0 ? -1 : spec.num_experts;
  testkit::copy_to_device(inputs.topk_ids.get(), run.routing.ids, stream.get());
  run.x = x_host(weights, inputs, stream.get());
  for (int h = 0; h < spec.hidden; ++h) {
    if (zero_token >= 0) run.x[static_cast<std::size_t>(zero_token) * spec.hidden + h] = 0;
    if (huge_token >= 0)
      run.x[static_cast<std::size_t>(huge_token) * spec.hidden + h] =
          reference::float_to_bf16((h % 2 ? 1.0f : -1.0f) * (1.0e4f + 37.0f * h));
  }
  testkit::copy_to_device(inputs.x.get(), run.x, stream.get());
  for (int separate = 0; separate < 2; ++separate) {
    if (separate == 1) setenv("HMOE_FUSED_REQUANT", "0", 1);
    EXPECT_EQ(gemm::fused_requant_environment(), separate == 0);
    PlanOptions options{tokens, Orientation::kAuto, 0, pair};
    options.split_k = split_k;
    const MoeRunner runner(spec, options);   // reads HMOE_FUSED_REQUANT
    unsetenv("HMOE_FUSED_REQUANT");
    EXPECT_EQ(runner.plan_info(tokens).gemm1_kernel, pair.substr(0, pair.find('+')));
    EXPECT_FALSE(runner.plan_info(tokens).fused_decode);
    const DeviceBuffer workspace(runner.workspace_bytes());
    const std::size_t out_count = static_cast<std::size_t>(tokens) * spec.hidden;
    const DeviceBuffer out(out_count * sizeof(std::uint16_t));
    RunArgs args = testkit::run_args(weights, inputs, out.get());
    args.workspace = workspace.get();
    args.workspace_size = workspace.bytes();
    check(runner, separate == 0, args);
    HMOE_CUDA_CHECK(cudaMemsetAsync(workspace.get(), poison, workspace.bytes(), stream.get()));
    testkit::poison_bf16(out.get(), out_count, stream.get());
    testkit::run_layer(runner, args, inputs, stream.get());
    stream.synchronize();
    run.outputs[separate] = testkit::copy_to_host<std::uint16_t>(out.get(), out_count, stream.get());
  }
  return run;
}

// The fused and the separate run gave the same bits, and the all-zero token's output is exactly zero.
void expect_same_bits_and_zero_token(const FusedAndSeparate& run, const MoeSpec& spec, int zero_token,
                                     const std::string& what) {
  EXPECT_EQ(std::memcmp(run.outputs[0].data(), run.outputs[1].data(), run.outputs[0].size() * sizeof(std::uint16_t)), 0)
      << what << ": the fused path and the separate pass differ";
  if (zero_token < 0) return;
  for (int h = 0; h < spec.hidden; ++h)
    ASSERT_EQ(run.outputs[0][static_cast<std::size_t>(zero_token) * spec.hidden + h] & 0x7FFF, 0)
        << what << ": the all-zero token's output at " << h;
}

// GEMM1's 256-row block-scaled tiles write GEMM2's e4m3 rows and 1×128 group scales from their epilogue
// (gemm::fuses_requant); HMOE_FUSED_REQUANT=0 keeps the bf16 output and the separate pass. The two must
// give the same bits — whole tiles (staged, TMA) and an expert's partial last tile (direct stores),
// UE8M0 scales, several groups a row (olmoe-1b-7b I = 1024) and two (deepseek-v3-tp8 I = 256), skewed
// and extreme routing, invalid ids, an all-zero token (its groups get scale 1, its output is exactly zero)
// and a huge one (the scales follow the amax, and nothing becomes Inf or NaN; issue #4) — and match the
// reference. The workspace is poisoned: the fused run must not lean on a bf16 intermediate it never wrote.
TEST(RunnerContract, FusedRequantGivesTheSeparatePassBits) {
  HMOE_REQUIRE_HOPPER_GPU();
  const std::string pair = "swiglu_normal_t128_w256_fp8block+weighted_normal_t128_w256_fp8block_s3";
  MoeSpec olmoe_ue8m0 = preset("olmoe-1b-7b");
  olmoe_ue8m0.weight_dtype = WeightDType::kFP8E4M3;
  olmoe_ue8m0.scheme = QuantScheme::kBlock128;
  olmoe_ue8m0.ue8m0_scales = true;
  const testkit::Stream weight_stream;
  const testkit::LayerWeights olmoe_weights =
      testkit::make_layer_weights(olmoe_ue8m0, kWeightSeed, /*keep_host_copy=*/true, weight_stream.get());
  struct Case {
    const testkit::LayerWeights* weights;
    const char* what;
    int tokens;
    RoutingMode routing;
  };
  for (const Case& c : {Case{&cached_fp8_weights("qwen3-30b-a3b", QuantScheme::kBlock128), "qwen3-30b-a3b fp8-block", 1000,
                             RoutingMode::kZipf},
                        Case{&cached_fp8_weights("qwen3-30b-a3b", QuantScheme::kBlock128), "qwen3-30b-a3b fp8-block", 777,
                             RoutingMode::kExtreme},
                        Case{&cached_fp8_weights("deepseek-v3-tp8", QuantScheme::kBlock128), "deepseek-v3-tp8 fp8-block",
                             1100, RoutingMode::kZipf},
                        Case{&olmoe_weights, "olmoe-1b-7b fp8-block (ue8m0)", 1000, RoutingMode::kZipf}}) {
    const std::string what = std::string(c.what) + " T=" + std::to_string(c.tokens) + " " + testkit::to_string(c.routing);
    const int zero_token = 3;
    const FusedAndSeparate run = run_fused_and_separate(
        *c.weights, pair, 0, c.tokens, c.routing, zero_token, 10, 0xff,
        [&](const MoeRunner& runner, bool fused, RunArgs&) {
          EXPECT_EQ(runner.plan_info(c.tokens).fused_requant, fused) << what;
        });
    expect_same_bits_and_zero_token(run, c.weights->spec, zero_token, what);
    const testkit::CheckResult result = testkit::compare_with_reference(
        *c.weights, run.x, run.routing, run.outputs[0], reference_token_budget(c.weights->spec), 13);
    expect_matches_reference(result, what + ", fused");
  }
}

// fp8-tensor with dynamic scales: GEMM1's epilogue keeps the amax of its bf16 output (PlanInfo::gemm1_amax),
// which the re-quantisation pass otherwise takes in a pass of its own (HMOE_FUSED_REQUANT=0). The two must
// give the same bits through every epilogue path — 128×256 and 128×128 tiles (staged whole tiles, direct
// partial ones), 64×128 (direct), Swap-AB 16×64 with and without K split over CTAs — at T = 1, 7 and
// 1000, skewed and extreme routing, invalid ids, an all-zero token and (T = 1000) a huge one whose SwiGLU
// output sets the amax; and match the reference. The workspace is poisoned with a huge float: the amax
// slot must be zeroed before GEMM1 raises it.
TEST(RunnerContract, Gemm1AmaxGivesTheAmaxPassBits) {
  HMOE_REQUIRE_HOPPER_GPU();
  struct Case {
    const char* preset;
    const char* pair;
    int split_k;
    int tokens;
    RoutingMode routing;
  };
  // (deepseek-v3-tp8 at T = 2: few output tiles and 56 K blocks, so K splits 4 ways; qwen3-30b-a3b's T = 7
  // has too many output tiles for the split workspace)
  for (const Case& c :
       {Case{"qwen3-30b-a3b", "swiglu_normal_t128_w256_fp8+weighted_normal_t128_w256_fp8_s3", 0, 1000, RoutingMode::kZipf},
        Case{"qwen3-30b-a3b", "swiglu_normal_t128_w128_fp8+weighted_normal_t128_w128_fp8", 0, 1000, RoutingMode::kExtreme},
        Case{"qwen3-30b-a3b", "swiglu_normal_t64_w128_fp8+weighted_normal_t64_w128_fp8", 0, 1000, RoutingMode::kZipf},
        Case{"qwen3-30b-a3b", "swiglu_swap_t16_w64_fp8+weighted_swap_t16_w64_fp8", 1, 7, RoutingMode::kZipf},
        Case{"qwen3-30b-a3b", "swiglu_swap_t16_w64_fp8+weighted_swap_t16_w64_fp8", 1, 1, RoutingMode::kZipf},
        Case{"deepseek-v3-tp8", "swiglu_swap_t16_w64_fp8+weighted_swap_t16_w64_fp8", 4, 2, RoutingMode::kExtreme},
        Case{"deepseek-v3-tp8", "swiglu_swap_t16_w64_fp8+weighted_swap_t16_w64_fp8", 4, 2, RoutingMode::kZipf}}) {
    const testkit::LayerWeights& weights = cached_fp8_weights(c.preset, QuantScheme::kPerTensor);
    const std::string what = std::string(c.preset) + " " + c.pair + " split_k=" + std::to_string(c.split_k) + " T=" +
                             std::to_string(c.tokens) + " " + testkit::to_string(c.routing);
    const int zero_token = c.tokens > 3 ? 3 : -1;
    const FusedAndSeparate run = run_fused_and_separate(
        weights, c.pair, c.split_k, c.tokens, c.routing, zero_token, c.tokens >= 1000 ? 10 : -1, 0x7e,
        [&](const MoeRunner& runner, bool fused, RunArgs&) {
          const PlanInfo plan = runner.plan_info(c.tokens);
          EXPECT_EQ(plan.gemm1_amax, fused) << what;
          EXPECT_EQ(plan.gemm1_splits > 1, c.split_k > 1) << what;
        });
    expect_same_bits_and_zero_token(run, weights.spec, zero_token, what);
    // (a dynamic per-tensor reference runs GEMM1 on every token in float64: at T = 1000 the bits above tie
    // the run to the separate pass, which the FP8 tests check against the reference at that size)
    if (c.tokens >= 1000) continue;
    const testkit::CheckResult result = testkit::compare_with_reference(weights, run.x, run.routing, run.outputs[0],
                                                                        reference_token_budget(weights.spec), 17);
    expect_matches_reference(result, what + ", GEMM1's amax");
  }
}

// fp8-tensor with a static intermediate scale (HMOE_STATIC_REQUANT=0 turns it off; never where I % 128 != 0):
// GEMM1's 256-row tiles write GEMM2's e4m3 input under that scale themselves (PlanInfo::fused_requant;
// HMOE_FUSED_REQUANT=0 keeps the bf16 output and the separate pass). The two must give the same bits —
// whole and partial tiles, skewed and extreme routing, invalid ids, an all-zero and a huge token (its values
// saturate) — and match the reference; and with scales nobody would calibrate (1e-30: everything saturates
// and the divisor takes its 2^100 factor; negative; zero), which the fused epilogue must still divide exactly
// as the separate pass does (quant::divide_static_rn).
TEST(RunnerContract, StaticScaleRequantGivesTheSeparatePassBits) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::LayerWeights& weights = cached_fp8_weights("qwen3-30b-a3b", QuantScheme::kPerTensor, /*static_scales=*/true);
  const std::string pair = "swiglu_normal_t128_w256_fp8+weighted_normal_t128_w256_fp8_s3";
  EXPECT_TRUE(MoeRunner(weights.spec, PlanOptions{16, Orientation::kAuto, 0, pair}).plan_info(16).fused_requant)
      << "static fp8-tensor re-quantisation in GEMM1 is on by default";
  setenv("HMOE_STATIC_REQUANT", "0", 1);
  EXPECT_FALSE(MoeRunner(weights.spec, PlanOptions{16, Orientation::kAuto, 0, pair}).plan_info(16).fused_requant)
      << "HMOE_STATIC_REQUANT=0 turns it off";
  unsetenv("HMOE_STATIC_REQUANT");
  MoeSpec narrow = weights.spec;   // I = 320: the last 256-row tile holds half a group
  narrow.intermediate = 320;
  EXPECT_FALSE(MoeRunner(narrow, PlanOptions{16, Orientation::kAuto, 0, pair}).plan_info(16).fused_requant);
  struct Case {
    int tokens;
    RoutingMode routing;
    float intermediate_scale;   // used when not `calibrated` (the weights' own static scale)
    bool calibrated;
  };
  for (const Case& c : {Case{1000, RoutingMode::kZipf, 0.0f, true}, Case{777, RoutingMode::kExtreme, 0.0f, true},
                        Case{1000, RoutingMode::kZipf, 1e-30f, false}, Case{300, RoutingMode::kZipf, -0.25f, false},
                        Case{300, RoutingMode::kUniform, 0.0f, false}}) {
    const std::string what = "qwen3-30b-a3b fp8-tensor(static) T=" + std::to_string(c.tokens) + " " +
                             testkit::to_string(c.routing) +
                             (c.calibrated ? std::string() : " intermediate scale " + std::to_string(c.intermediate_scale));
    const DeviceBuffer scale(sizeof(float));
    {
      const testkit::Stream stream;
      testkit::copy_to_device(scale.get(), std::vector<float>{c.intermediate_scale}, stream.get());
      stream.synchronize();
    }
    const int zero_token = 3;
    const FusedAndSeparate run = run_fused_and_separate(
        weights, pair, 0, c.tokens, c.routing, zero_token, 10, 0xff, [&](const MoeRunner& runner, bool fused, RunArgs& args) {
          EXPECT_EQ(runner.plan_info(c.tokens).fused_requant, fused) << what;
          ASSERT_NE(args.intermediate_act_scale, nullptr) << what;
          if (!c.calibrated) args.intermediate_act_scale = scale.as<const float>();
        });
    // (a zero or negative scale has no meaningful output: the bits must agree, nothing more)
    expect_same_bits_and_zero_token(run, weights.spec, c.calibrated ? zero_token : -1, what);
    if (!c.calibrated) continue;
    const testkit::CheckResult result = testkit::compare_with_reference(weights, run.x, run.routing, run.outputs[0],
                                                                        reference_token_budget(weights.spec), 19);
    expect_matches_reference(result, what + ", fused");
  }
}

// At decode sizes run_from_logits routes and permutes in one kernel (permute/route_permute.cu); it
// must give the bits of the routing kernel followed by the permute stage: run_from_logits against
// routing::launch_topk into separate buffers and run_from_topk on them, every preset (softmax and
// grouped routing), T = 1, 7, 16 (fused where E ≤ 256) and 17 (two kernels on both sides).
TEST(RunnerContract, FusedRoutingPermuteGivesTheTwoKernelsBits) {
  HMOE_REQUIRE_HOPPER_GPU();
  for (const std::string& preset_name : preset_names()) {
    const testkit::LayerWeights& weights = cached_weights(preset_name);
    const MoeSpec& spec = weights.spec;
    for (int tokens : {1, 7, 16, 17}) {
      const std::string context = preset_name + " T=" + std::to_string(tokens);
      EXPECT_EQ(permute::route_permute_applies(spec, tokens), tokens <= 16 && spec.num_experts <= 256) << context;
      const testkit::Stream stream;
      const testkit::LayerInputs inputs =
          testkit::make_layer_inputs(weights, tokens, Entry::kLogits, {RoutingMode::kZipf, 1, 4}, stream.get());
      const Harness harness(weights, tokens);
      const RunArgs args = harness.args(weights, inputs);
      testkit::poison_bf16(harness.out.get(), harness.out_count, stream.get());
      harness.runner.run_from_logits(args, inputs.router_logits.get(), stream.get());
      stream.synchronize();
      const std::vector<std::uint16_t> from_logits = harness.out_host(stream.get());

      const std::size_t slots = static_cast<std::size_t>(tokens) * spec.top_k;
      const DeviceBuffer ids(slots * sizeof(std::int32_t)), routing_weights(slots * sizeof(float));
      routing::launch_topk(spec, inputs.router_logits.get(), args.weights.correction_bias, tokens,
                           static_cast<int*>(ids.get()), static_cast<float*>(routing_weights.get()), stream.get());
      testkit::poison_bf16(harness.out.get(), harness.out_count, stream.get());
      harness.runner.run_from_topk(args, static_cast<const std::int32_t*>(ids.get()),
                                   static_cast<const float*>(routing_weights.get()), stream.get());
      stream.synchronize();
      const std::vector<std::uint16_t> from_topk = harness.out_host(stream.get());
      EXPECT_EQ(std::memcmp(from_logits.data(), from_topk.data(), from_logits.size() * sizeof(std::uint16_t)), 0)
          << context << ": the fused routing + permute path and the two kernels give different outputs";
    }
  }
}

// PlanOptions::replay_graphs: the eager first call, the capturing second and the replayed later
// calls give the bits an eager runner gives, with new input values in the same buffers every call;
// other pointers are another key (eager again); a call inside the caller's own capture enqueues the
// kernels into it.
TEST(RunnerContract, ReplayGraphsMatchEagerRuns) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream;
  MoeSpec fp8_spec = preset("deepseek-v3-tp8");
  fp8_spec.weight_dtype = WeightDType::kFP8E4M3;
  fp8_spec.scheme = QuantScheme::kBlock128;
  const testkit::LayerWeights fp8_weights = testkit::make_layer_weights(fp8_spec, 5, false, stream.get());
  const struct {
    const char* name;
    const testkit::LayerWeights* weights;
  } layers[] = {{"qwen3-30b-a3b bf16", &cached_weights("qwen3-30b-a3b")}, {"deepseek-v3-tp8 fp8-block", &fp8_weights}};
  for (const auto& layer : layers) {
    const testkit::LayerWeights& weights = *layer.weights;
    for (int num_tokens : {1, 64, 1000}) {
      for (Entry entry : {Entry::kLogits, Entry::kTopK}) {
        const std::string what = std::string(layer.name) + " T=" + std::to_string(num_tokens) + " " +
                                 testkit::to_string(entry);
        testkit::LayerInputs inputs = testkit::make_layer_inputs(weights, num_tokens, entry, {}, stream.get());
        const Harness eager(weights, num_tokens);
        const Harness replay(weights, num_tokens, Orientation::kAuto, /*replay_graphs=*/true);
        const auto compare = [&](const Harness& replaying, const std::string& call) {
          testkit::poison_bf16(eager.out.get(), eager.out_count, stream.get());
          testkit::poison_bf16(replaying.out.get(), replaying.out_count, stream.get());
          testkit::run_layer(eager.runner, eager.args(weights, inputs), inputs, stream.get());
          testkit::run_layer(replay.runner, replaying.args(weights, inputs), inputs, stream.get());
          stream.synchronize();
          const std::vector<std::uint16_t> expected = eager.out_host(stream.get());
          const std::vector<std::uint16_t> got = replaying.out_host(stream.get());
          EXPECT_EQ(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(std::uint16_t)), 0)
              << what << ", " << call << ": differs from the eager runner";
        };
        for (int call = 0; call < 4; ++call) {
          testkit::fill_layer_inputs(inputs, weights, {RoutingMode::kUniform, 1, 100u + call}, stream.get());
          compare(replay, "call " + std::to_string(call));
          EXPECT_EQ(replay.runner.graph_count(), call == 0 ? 0u : 1u) << what << ", call " << call;
        }
        // Another output buffer: a new key, run eagerly (no second graph yet).
        const Harness other(weights, num_tokens);
        compare(other, "other out");
        EXPECT_EQ(replay.runner.graph_count(), 1u) << what;
        // Inside the caller's capture: the kernels go into the caller's graph.
        testkit::fill_layer_inputs(inputs, weights, {RoutingMode::kUniform, 1, 200u}, stream.get());
        testkit::run_layer(eager.runner, eager.args(weights, inputs), inputs, stream.get());
        testkit::poison_bf16(replay.out.get(), replay.out_count, stream.get());
        stream.synchronize();
        HMOE_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
        testkit::run_layer(replay.runner, replay.args(weights, inputs), inputs, stream.get());
        cudaGraph_t graph = nullptr;
        HMOE_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
        cudaGraphExec_t exec = nullptr;
        HMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        HMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
        stream.synchronize();
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        const std::vector<std::uint16_t> expected = eager.out_host(stream.get());
        const std::vector<std::uint16_t> got = replay.out_host(stream.get());
        EXPECT_EQ(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(std::uint16_t)), 0)
            << what << ": inside the caller's capture";
      }
    }
  }
}

// PlanOptions::skip_stages (hmoe bench --skip): a skipped stage launches nothing — skipping the
// combine leaves the poisoned output untouched — and later stages read what the last full run left
// in the workspace: skipping the permute and both GEMMs after a full run reproduces its output bit
// for bit (the permute too: its row order inside an expert may differ from run to run).
TEST(RunnerContract, SkippedStagesLaunchNothingAndReuseTheWorkspace) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::LayerWeights& weights = cached_weights("qwen3-30b-a3b");
  const testkit::Stream stream;
  for (int num_tokens : {1, 300}) {
    const testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, num_tokens, Entry::kLogits, {}, stream.get());
    // Skipping runners run the unfused kernels, so the full run that fills their inputs does too.
    const Harness full(weights, num_tokens, Orientation::kAuto, false, FusedDecode::kOff);
    const RunArgs args = full.args(weights, inputs);
    testkit::run_layer(full.runner, args, inputs, stream.get());
    stream.synchronize();
    const std::vector<std::uint16_t> expected = full.out_host(stream.get());
    for (const std::uint32_t skip : {std::uint32_t{kStageCombine}, std::uint32_t{kStagePermute | kStageGemm1 | kStageGemm2}}) {
      PlanOptions options{num_tokens, Orientation::kAuto};
      options.skip_stages = skip;
      const MoeRunner skipping(weights.spec, options);
      testkit::poison_bf16(full.out.get(), full.out_count, stream.get());
      testkit::run_layer(skipping, args, inputs, stream.get());
      stream.synchronize();
      const std::vector<std::uint16_t> got = full.out_host(stream.get());
      if (skip == kStageCombine) {
        EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](std::uint16_t v) { return v == testkit::kPoisonBf16; }))
            << "T=" << num_tokens << ": skipping the combine still wrote the output";
      } else {
        EXPECT_EQ(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(std::uint16_t)), 0)
            << "T=" << num_tokens << ": skipping the GEMMs did not reuse the full run's rows";
      }
    }
  }
}

// PlanOptions::warm_up (on by default) runs a small copy of the layer while planning, on its own stream with
// its own scratch. It must not break a capture the caller has in progress (global mode, the
// strictest), and must give its scratch back: 20 plans may not cost device memory.
TEST(RunnerContract, PlanTimeWarmUpLeavesCapturesAndMemoryAlone) {
  HMOE_REQUIRE_HOPPER_GPU();
  struct Case { const char* preset_name; WeightDType dtype; QuantScheme scheme; bool batch_invariant; };
  for (const Case& c : {Case{"qwen3-30b-a3b", WeightDType::kBF16, QuantScheme::kNone, false},
                        Case{"deepseek-v3-tp8", WeightDType::kFP8E4M3, QuantScheme::kBlock128, false},
                        Case{"qwen3-30b-a3b", WeightDType::kFP8E4M3, QuantScheme::kPerTensor, true}}) {
    MoeSpec spec = preset(c.preset_name);
    spec.weight_dtype = c.dtype;
    spec.scheme = c.scheme;
    spec.batch_invariant = c.batch_invariant;
    const std::string what = std::string(c.preset_name) + " " + to_string(c.scheme);
    const PlanOptions options{64};
    { const MoeRunner first(spec, options); }   // loads the modules (not what is measured)
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::size_t free_before = 0, free_after = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
    for (int plan = 0; plan < 20; ++plan) {
      const MoeRunner runner(spec, options);
      EXPECT_GT(runner.workspace_bytes(), 0u);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
    EXPECT_LE(static_cast<long long>(free_before) - static_cast<long long>(free_after), 2LL << 20)
        << what << ": 20 plans kept device memory";

    const testkit::Stream stream;
    const DeviceBuffer marker(256);
    ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(marker.get(), 0, 256, stream.get()), cudaSuccess);
    std::string error;
    try {
      const MoeRunner runner(spec, options);
    } catch (const std::exception& exception) {
      error = exception.what();
    }
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess) << what << ": planning broke the capture";
    EXPECT_EQ(error, "") << what << ": planning during a capture threw";
    if (graph != nullptr) {
      std::size_t nodes = 0;
      EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
      EXPECT_EQ(nodes, 1u) << what << ": the warm-up leaked into the caller's capture";
      cudaGraphDestroy(graph);
    }
    (void)cudaGetLastError();
  }
}

TEST(RunnerContract, GraphReplaysSeeNewInputValues) {
  HMOE_REQUIRE_HOPPER_GPU();
  const struct {
    const char* preset_name;
    Entry entry;
  } cases[] = {{"qwen3-30b-a3b", Entry::kLogits}, {"deepseek-v3-tp8", Entry::kLogits}, {"olmoe-1b-7b", Entry::kTopK}};
  for (const auto& [preset_name, entry] : cases) {
    const testkit::LayerWeights& weights = cached_weights(preset_name);
    const testkit::Stream stream;
    const int num_tokens = 64;
    testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, num_tokens, entry, {RoutingMode::kUniform, 1, 5}, stream.get());
    const Harness harness(weights, num_tokens);
    const RunArgs args = harness.args(weights, inputs);
    const testkit::GraphExec graph = testkit::GraphExec::capture(
        stream.get(), [&] { testkit::run_layer(harness.runner, args, inputs, stream.get()); });

    std::vector<std::uint16_t> previous_out;
    for (std::uint64_t input_seed : {5, 6}) {
      testkit::fill_layer_inputs(inputs, weights, {RoutingMode::kZipf, 1, input_seed}, stream.get());
      testkit::poison_bf16(harness.out.get(), harness.out_count, stream.get());
      graph.launch(stream.get());
      stream.synchronize();
      const std::vector<std::uint16_t> out = harness.out_host(stream.get());
      const testkit::CheckResult result =
          testkit::compare_with_reference(weights, x_host(weights, inputs, stream.get()),
                                          testkit::host_routing(weights, inputs, stream.get()), out,
                                          reference_token_budget(weights.spec), input_seed);
      expect_matches_reference(result, std::string(preset_name) + " graph replay, input seed " +
                                           std::to_string(input_seed));
      EXPECT_NE(out, previous_out) << preset_name << ": the replay ignored the new inputs";
      previous_out = out;
    }
  }
}

// Where the permute stage is one kernel (single block, or routing + permute fused), a layer enqueues no
// memset: that kernel zeroes what the later stages accumulate into with atomics (permute::ZeroedSlots: the
// dynamic fp8-tensor amax slots of x and of the intermediate, the split-K counters); above
// kSingleBlockEntries pairs one memset is left (the multi-block count's expert_counts), and the work-list
// kernel zeroes the slots. The workspace is poisoned with 0x7F bytes (3.4e38 as a float: an amax slot left
// unzeroed makes a scale that flushes every value to zero; a split counter left unzeroed never completes
// its sum): the output must be the bits of a run on a zeroed workspace and match the reference.
TEST(RunnerContract, PermuteZeroesTheTensorAmaxSlots) {
  HMOE_REQUIRE_HOPPER_GPU();
  struct Case {
    const char* preset;
    int tokens;
    Entry entry;
    int split_k;
    const char* pair;   // "" : the tuned table's
    int memsets;
  };
  // (qwen3-30b-a3b T = 1100: 8800 pairs, the multi-block stage; deepseek-v3-tp8 T = 2 splits K 4 ways)
  const char* swap_pair = "swiglu_swap_t16_w64_fp8+weighted_swap_t16_w64_fp8";
  for (const Case& c : {Case{"qwen3-30b-a3b", 1, Entry::kLogits, 0, "", 0}, Case{"qwen3-30b-a3b", 7, Entry::kTopK, 0, "", 0},
                        Case{"qwen3-30b-a3b", 300, Entry::kTopK, 0, "", 0},
                        Case{"qwen3-30b-a3b", 1100, Entry::kTopK, 0, "", 1},
                        Case{"deepseek-v3-tp8", 2, Entry::kLogits, 4, swap_pair, 0}}) {
    const testkit::LayerWeights& weights = cached_fp8_weights(c.preset, QuantScheme::kPerTensor);
    const std::string what = std::string(c.preset) + " fp8-tensor T=" + std::to_string(c.tokens) +
                             (c.entry == Entry::kLogits ? " from logits" : " from top-k");
    const testkit::Stream stream;
    const testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, c.tokens, c.entry, {RoutingMode::kZipf, 1, 23}, stream.get());
    PlanOptions options{c.tokens, Orientation::kAuto, 0, c.pair};
    options.split_k = c.split_k;
    options.fused_decode = FusedDecode::kOff;
    const MoeRunner runner(weights.spec, options);
    const PlanInfo plan = runner.plan_info(c.tokens);
    EXPECT_FALSE(plan.fused_decode) << what;
    EXPECT_EQ(plan.gemm1_splits > 1, c.split_k > 1) << what;
    const DeviceBuffer workspace(runner.workspace_bytes());
    const std::size_t out_count = static_cast<std::size_t>(c.tokens) * weights.spec.hidden;
    const DeviceBuffer out(out_count * sizeof(std::uint16_t));
    RunArgs args = testkit::run_args(weights, inputs, out.get());
    args.workspace = workspace.get();
    args.workspace_size = workspace.bytes();
    ASSERT_EQ(args.act_scale, nullptr) << what << ": the dynamic scales are under test";
    ASSERT_EQ(args.intermediate_act_scale, nullptr) << what;

    cudaGraph_t graph =
        testkit::capture_graph(stream.get(), [&] { testkit::run_layer(runner, args, inputs, stream.get()); });
    const testkit::GraphNodeCounts counts = testkit::count_graph_nodes(graph);
    cudaGraphDestroy(graph);
    EXPECT_EQ(counts.memsets, c.memsets) << what << ": memset nodes in the layer's graph";

    std::vector<std::uint16_t> outputs[2];
    for (const int poison : {0x7F, 0x00}) {
      HMOE_CUDA_CHECK(cudaMemsetAsync(workspace.get(), poison, workspace.bytes(), stream.get()));
      testkit::poison_bf16(out.get(), out_count, stream.get());
      testkit::run_layer(runner, args, inputs, stream.get());
      stream.synchronize();
      outputs[poison == 0 ? 1 : 0] = testkit::copy_to_host<std::uint16_t>(out.get(), out_count, stream.get());
    }
    EXPECT_EQ(std::memcmp(outputs[0].data(), outputs[1].data(), out_count * sizeof(std::uint16_t)), 0)
        << what << ": a poisoned workspace changed the output";
    const testkit::CheckResult result =
        testkit::compare_with_reference(weights, x_host(weights, inputs, stream.get()),
                                        testkit::host_routing(weights, inputs, stream.get()), outputs[0],
                                        reference_token_budget(weights.spec), 23);
    expect_matches_reference(result, what + ", poisoned workspace");
  }
}

}  // namespace
}  // namespace hmoe::test
