// The dispatcher on the GPU: with the tuned directory emptied the analytic rule still runs every
// layer correctly, a tuned table for this device is picked up (its "fused" buckets too), and every
// variant pair the tuner may choose matches the float64 reference.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "dispatch/json.hpp"
#include "dispatch/registry.hpp"
#include "dispatch/tuned_table.hpp"
#include "gemm/trace.hpp"
#include "gpu_test_support.hpp"
#include "testkit/check.hpp"
#include "testkit/gemm_trace.hpp"

namespace hmoe::test {
namespace {

namespace fs = std::filesystem;

class ScopedTunedDir {
 public:
  ScopedTunedDir() {
    std::string pattern = (fs::temp_directory_path() / "hmoe-tuned-gpu-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
    setenv(dispatch::kTunedDirEnv, path_.c_str(), 1);
  }
  ~ScopedTunedDir() {
    unsetenv(dispatch::kTunedDirEnv);
    std::error_code error;
    fs::remove_all(path_, error);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs one layer with plan_options and compares it with the reference; the output's bits go to
// out_bits when given. With poison_workspace the workspace starts as bf16 NaNs too, so a GEMM that
// leaves rows of its output unwritten makes the layer's output non-finite there.
testkit::CheckResult run_and_check(const testkit::LayerWeights& weights, int num_tokens, const PlanOptions& plan_options,
                                   PlanInfo* plan, std::vector<std::uint16_t>* out_bits = nullptr,
                                   bool poison_workspace = false,
                                   const testkit::RoutingDraw& draw = {testkit::RoutingMode::kUniform, 1, 2}) {
  const testkit::Stream stream;
  const testkit::LayerInputs inputs =
      testkit::make_layer_inputs(weights, num_tokens, testkit::Entry::kLogits, draw, stream.get());
  const MoeRunner runner(weights.spec, plan_options);
  *plan = runner.plan_info(num_tokens);
  testkit::DeviceBuffer workspace(runner.workspace_bytes());
  if (poison_workspace) testkit::poison_bf16(workspace.get(), workspace.bytes() / 2, stream.get());
  const std::size_t out_count = static_cast<std::size_t>(num_tokens) * weights.spec.hidden;
  testkit::DeviceBuffer out(out_count * sizeof(std::uint16_t));
  testkit::poison_bf16(out.get(), out_count, stream.get());
  RunArgs args = testkit::run_args(weights, inputs, out.get());
  args.workspace = workspace.get();
  args.workspace_size = workspace.bytes();
  testkit::run_layer(runner, args, inputs, stream.get());
  stream.synchronize();
  const auto out_host = testkit::copy_to_host<std::uint16_t>(out.get(), out_count, stream.get());
  const auto x_host = testkit::copy_to_host<std::uint16_t>(inputs.x.get(), out_count, stream.get());
  if (out_bits != nullptr) *out_bits = out_host;
  return testkit::compare_with_reference(weights, x_host, testkit::host_routing(weights, inputs, stream.get()), out_host,
                                         reference_token_budget(weights.spec), 1);
}

void expect_pass(const testkit::CheckResult& result, const PlanInfo& plan, int num_tokens) {
  std::cout << "  T=" << num_tokens << " " << plan.gemm1_kernel << "+" << plan.gemm2_kernel << " (" << plan.source
            << "): rel_err " << result.rel_error << ", unwritten " << result.unwritten << "\n";
  EXPECT_EQ(result.unwritten, 0u);
  EXPECT_EQ(result.nonfinite, 0u);
  EXPECT_LE(result.rel_error, result.tolerance);
}

TEST(DispatchGpu, EmptyTunedDirectoryRunsOnTheAnalyticRule) {
  HMOE_REQUIRE_HOPPER_GPU();
  const ScopedTunedDir empty;
  const testkit::LayerWeights& weights = cached_weights("qwen3-30b-a3b");
  for (int num_tokens : {1, 100, 2048}) {
    PlanInfo plan;
    const testkit::CheckResult result = run_and_check(weights, num_tokens, PlanOptions{num_tokens}, &plan);
    EXPECT_EQ(plan.source, "analytic");
    expect_pass(result, plan, num_tokens);
  }
}

// Writes the olmoe-1b-7b bf16 table for this device into dir with the given bucket members; returns
// its file name.
std::string write_olmoe_table(const ScopedTunedDir& dir, const std::string& buckets) {
  const std::string device = dispatch::current_device_name();
  const std::string name = dispatch::tuned_file_name(preset("olmoe-1b-7b"), device);
  std::ofstream(fs::path(dir.path()) / name)
      << "{\"device_name\": " << dispatch::json_quote(device) << ", \"dtype\": \"bf16\", \"E\": 64, \"N\": 1024, "
      << "\"K\": 2048, \"buckets\": {" << buckets << "}}";
  return name;
}

TEST(DispatchGpu, TunedTableForThisDeviceIsUsed) {
  HMOE_REQUIRE_HOPPER_GPU();
  const ScopedTunedDir dir;
  const testkit::LayerWeights& weights = cached_weights("olmoe-1b-7b");
  // A choice the analytic rule would not make at T = 4: Swap-AB with 32-token tiles.
  const std::string name = write_olmoe_table(
      dir, "\"4\": {\"gemm1\": \"swiglu_swap_t32_w64\", \"gemm2\": \"weighted_swap_t32_w64\"}");
  PlanInfo plan;
  const testkit::CheckResult result = run_and_check(weights, 4, PlanOptions{4}, &plan);
  EXPECT_EQ(plan.source, "tuned:" + name);
  EXPECT_EQ(plan.gemm1_kernel, "swiglu_swap_t32_w64");
  expect_pass(result, plan, 4);
}

// A bucket marked "fused" (`hmoe tune` timed the fused decode layer faster than its pair) runs the
// fused layer under the default FusedDecode::kAuto at the T it serves, prepared and warmed up at plan
// time; other buckets, and kOff, run their pair.
TEST(DispatchGpu, TunedFusedBucketRunsTheFusedDecodeLayer) {
  HMOE_REQUIRE_HOPPER_GPU();
  if (std::getenv("HMOE_FUSED_DECODE") != nullptr) GTEST_SKIP() << "HMOE_FUSED_DECODE is set: it overrides the plans";
  const ScopedTunedDir dir;
  const testkit::LayerWeights& weights = cached_weights("olmoe-1b-7b");
  const std::string name = write_olmoe_table(
      dir, "\"1\": {\"gemm1\": \"swiglu_swap_t8_w64\", \"gemm2\": \"weighted_swap_t8_w64\", \"fused\": true}, "
           "\"4\": {\"gemm1\": \"swiglu_swap_t32_w64\", \"gemm2\": \"weighted_swap_t32_w64\"}");
  PlanInfo plan;
  testkit::CheckResult result = run_and_check(weights, 1, PlanOptions{1}, &plan);
  EXPECT_TRUE(plan.fused_decode);
  EXPECT_EQ(plan.gemm1_kernel, "decode_layer");
  EXPECT_EQ(plan.source, "tuned:" + name);
  expect_pass(result, plan, 1);
  result = run_and_check(weights, 3, PlanOptions{3}, &plan);   // nearer bucket 4
  EXPECT_FALSE(plan.fused_decode);
  EXPECT_EQ(plan.gemm1_kernel, "swiglu_swap_t32_w64");
  expect_pass(result, plan, 3);
  PlanOptions off{1};
  off.fused_decode = FusedDecode::kOff;
  result = run_and_check(weights, 1, off, &plan);
  EXPECT_FALSE(plan.fused_decode);
  EXPECT_EQ(plan.gemm1_kernel, "swiglu_swap_t8_w64");
  EXPECT_EQ(plan.source, "tuned:" + name);
  expect_pass(result, plan, 1);
}

// The tuner may pick any eligible pair at any T, also pairs the analytic rule never picks: each
// must be correct at a decode-like and a prefill-like token count, in every scheme;
// deepseek-v3-tp8 adds GEMM2's K = 256 (two 128-wide FP8 blocks per work item).
TEST(DispatchGpu, EveryEligibleVariantPairMatchesTheReference) {
  HMOE_REQUIRE_HOPPER_GPU();
  const std::vector<std::pair<std::string, const testkit::LayerWeights*>> layers = {
      {"qwen3-30b-a3b bf16", &cached_weights("qwen3-30b-a3b")},
      {"qwen3-30b-a3b fp8-tensor", &cached_fp8_weights("qwen3-30b-a3b", QuantScheme::kPerTensor)},
      {"qwen3-30b-a3b fp8-channel", &cached_fp8_weights("qwen3-30b-a3b", QuantScheme::kPerChannelPerToken)},
      {"qwen3-30b-a3b fp8-block", &cached_fp8_weights("qwen3-30b-a3b", QuantScheme::kBlock128)},
      {"deepseek-v3-tp8 fp8-block", &cached_fp8_weights("deepseek-v3-tp8", QuantScheme::kBlock128)},
  };
  for (const auto& [name, weights] : layers) {
    const std::vector<dispatch::PlanVariant> variants = dispatch::eligible_plan_variants(weights->spec);
    std::cout << name << ": " << variants.size() << " eligible pairs\n";
    EXPECT_GE(variants.size(), 4u) << name;
    for (const dispatch::PlanVariant& variant : variants) {
      for (int num_tokens : {5, 1000}) {
        PlanOptions options{num_tokens};
        options.force_variant = variant.id();
        PlanInfo plan;
        const testkit::CheckResult result = run_and_check(*weights, num_tokens, options, &plan);
        EXPECT_EQ(plan.source, "forced") << name;
        EXPECT_EQ(plan.gemm1_kernel + "+" + plan.gemm2_kernel, variant.id()) << name;
        expect_pass(result, plan, num_tokens);
      }
    }
  }
}

// Normal tiles with GemmConfig::kTmaStore (GEMM1's SwiGLU output and GEMM2's) stage a whole tile in
// shared memory and store it by TMA, and keep direct stores for an expert's last, partial tile and for
// a weight tile that reaches past N. ~10, ~65, ~350 and ~500 rows per expert (4 experts, top-2) give
// launches of partial tiles only, and of whole and partial tiles together; H = 1344 (per-tensor scales
// and bf16: block scales need H % 128 == 0) adds GEMM2's partial weight tile, I = 320 GEMM1's (2I = 640
// rows: the third 256-row tile reaches past 2I, so its staged output would reach past I; I is a multiple
// of 64, so 128-row GEMM1 tiles never do), and
// H = 1152 a 256-row FP8 tile whose second 128-row half lies past H (its block scales clamp to H's last
// block). The workspace is poisoned: a row either GEMM does not write shows as a non-finite output.
TEST(DispatchGpu, StagedTmaStoreTilesMatchTheReference) {
  HMOE_REQUIRE_HOPPER_GPU();
  const std::vector<std::tuple<QuantScheme, int, int, const char*>> cases = {
      {QuantScheme::kBlock128, 1024, 256, "swiglu_normal_t128_w128_fp8block+weighted_normal_t128_w128_fp8block"},
      {QuantScheme::kBlock128, 1024, 256, "swiglu_normal_t64_w128_fp8block+weighted_normal_t64_w128_fp8block_s3"},
      {QuantScheme::kBlock128, 1024, 256, "swiglu_normal_t64_w64_fp8block+weighted_normal_t64_w64_fp8block"},
      {QuantScheme::kBlock128, 1024, 256, "swiglu_normal_t128_w256_fp8block+weighted_normal_t128_w256_fp8block_s3"},
      {QuantScheme::kBlock128, 1152, 384, "swiglu_normal_t128_w256_fp8block+weighted_normal_t128_w256_fp8block_s3"},
      {QuantScheme::kPerTensor, 1344, 320, "swiglu_normal_t128_w256_fp8+weighted_normal_t128_w256_fp8_s3"},
      {QuantScheme::kPerChannelPerToken, 1024, 320, "swiglu_normal_t128_w256_fp8+weighted_normal_t128_w256_fp8_s3"},
      {QuantScheme::kPerTensor, 1024, 256, "swiglu_normal_t128_w128_fp8+weighted_normal_t128_w128_fp8"},
      {QuantScheme::kPerTensor, 1344, 320, "swiglu_normal_t128_w128_fp8+weighted_normal_t128_w128_fp8"},
      {QuantScheme::kPerChannelPerToken, 1344, 320, "swiglu_normal_t64_w128_fp8+weighted_normal_t64_w128_fp8_s3"},
      {QuantScheme::kNone, 1344, 320, "swiglu_normal_t128_w256+weighted_normal_t128_w256_s3"},
      {QuantScheme::kNone, 1344, 320, "swiglu_normal_t64_w128+weighted_normal_t64_w128_s3"},
      {QuantScheme::kNone, 1024, 256, "swiglu_normal_t128_w256+weighted_normal_t128_w256"},
  };
  for (const auto& [scheme, hidden, intermediate, variant] : cases) {
    MoeSpec spec = preset("mixtral-8x7b");   // softmax top-2
    spec.num_experts = 4;
    spec.hidden = hidden;
    spec.intermediate = intermediate;
    spec.weight_dtype = scheme == QuantScheme::kNone ? WeightDType::kBF16 : WeightDType::kFP8E4M3;
    spec.scheme = scheme;
    const testkit::Stream stream;
    const testkit::LayerWeights weights =
        testkit::make_layer_weights(spec, kWeightSeed, /*keep_host_copy=*/true, stream.get());
    for (int num_tokens : {20, 130, 700, 1000}) {
      PlanOptions options{num_tokens};
      options.force_variant = variant;
      PlanInfo plan;
      const testkit::CheckResult result =
          run_and_check(weights, num_tokens, options, &plan, nullptr, /*poison_workspace=*/true);
      EXPECT_EQ(plan.gemm1_kernel + "+" + plan.gemm2_kernel, variant) << "H=" << hidden << " I=" << intermediate;
      std::cout << "  H=" << hidden << " I=" << intermediate << ":";
      expect_pass(result, plan, num_tokens);
    }
  }
}

// Normal 128-token tiles that gather their token rows from x themselves (cp.async by the producer
// warpgroup, GemmConfig::kGatherCpAsync) multiply the same operands in the same K order as the tiles
// that read the gather pass's rows, so the layer's bits must be equal, with the pass's launch gone (for
// FP8, x is quantised in token order instead of into the sorted rows: the same e4m3 bytes, and the same
// scales, which stay per sorted row).
// Uniform, skewed (Zipf) and extreme routing give experts with no rows, partial tiles only, and many
// whole tiles; T = 1, 7, 130, 1000; the workspace is poisoned (an unwritten row shows as non-finite).
TEST(DispatchGpu, GatheringNormalTilesGiveTheGatherPassBits) {
  HMOE_REQUIRE_HOPPER_GPU();
  const std::vector<std::tuple<const char*, int, int, int, QuantScheme>> cases = {
      // softmax top-2: a 2I = 640-row w13, its third 256-row tile partial
      {"mixtral-8x7b", 8, 1344, 320, QuantScheme::kNone},
      // softmax top-8: each x row gathered by 8 tiles
      {"qwen3-30b-a3b", 16, 512, 192, QuantScheme::kNone},
      // fp8-tensor: the e4m3 rows of x in token order against the quantising gather pass's sorted rows
      {"qwen3-30b-a3b", 16, 512, 192, QuantScheme::kPerTensor},
      {"mixtral-8x7b", 8, 1344, 320, QuantScheme::kPerTensor},
      // fp8-channel and fp8-block: the values in token order, the per-token and 1×128 group scales per sorted row
      {"qwen3-30b-a3b", 16, 512, 192, QuantScheme::kPerChannelPerToken},
      {"qwen3-30b-a3b", 16, 512, 256, QuantScheme::kBlock128},
      {"mixtral-8x7b", 8, 1280, 384, QuantScheme::kBlock128},
  };
  for (const auto& [model, experts, hidden, intermediate, scheme] : cases) {
    const bool fp8 = scheme != QuantScheme::kNone;
    const std::string suffix = scheme == QuantScheme::kBlock128 ? "_fp8block" : fp8 ? "_fp8" : "";
    const std::string gathering =
        "swiglu_normal_t128_w256" + suffix + "_gather+weighted_normal_t128_w256" + suffix + "_s3";
    const std::string reading = "swiglu_normal_t128_w256" + suffix + "+weighted_normal_t128_w256" + suffix + "_s3";
    MoeSpec spec = preset(model);
    spec.num_experts = experts;
    spec.hidden = hidden;
    spec.intermediate = intermediate;
    spec.weight_dtype = fp8 ? WeightDType::kFP8E4M3 : WeightDType::kBF16;
    spec.scheme = scheme;
    const testkit::Stream stream;
    const testkit::LayerWeights weights =
        testkit::make_layer_weights(spec, kWeightSeed, /*keep_host_copy=*/true, stream.get());
    for (testkit::RoutingMode mode :
         {testkit::RoutingMode::kUniform, testkit::RoutingMode::kZipf, testkit::RoutingMode::kExtreme}) {
      for (int num_tokens : {1, 7, 130, 1000}) {
        SCOPED_TRACE(std::string(model) + " " + to_string(scheme) + " " + testkit::to_string(mode) +
                     " T=" + std::to_string(num_tokens));
        const testkit::RoutingDraw draw{mode, 3, static_cast<std::uint64_t>(num_tokens)};
        std::vector<std::uint16_t> gathered, read;
        PlanOptions options{num_tokens};
        options.force_variant = gathering;
        PlanInfo plan;
        const testkit::CheckResult result =
            run_and_check(weights, num_tokens, options, &plan, &gathered, /*poison_workspace=*/true, draw);
        EXPECT_EQ(plan.gemm1_kernel + "+" + plan.gemm2_kernel, gathering);
        expect_pass(result, plan, num_tokens);
        options.force_variant = reading;
        run_and_check(weights, num_tokens, options, &plan, &read, /*poison_workspace=*/true, draw);
        EXPECT_EQ(plan.gemm1_kernel + "+" + plan.gemm2_kernel, reading);
        ASSERT_EQ(gathered.size(), read.size());
        std::size_t differing = 0;
        for (std::size_t i = 0; i < gathered.size(); ++i) differing += gathered[i] != read[i];
        EXPECT_EQ(differing, 0u) << "of " << gathered.size() << " output values";
      }
    }
  }
}

// The GEMM timeline of a -DHMOE_GEMM_TRACE=ON build (src/gemm/trace.hpp, `hmoe trace`): the traced
// run is still right; each GEMM launch recorded every item it took with its events in order; the
// producer issued a stage for every item a consumer warpgroup took; the two warpgroups of a
// two-consumer tile took the same items. Decode (Swap-AB, gathering, split K) and prefill (two
// consumers, FP8 block scales). The default build records nothing: skipped there.
TEST(DispatchGpu, GemmTimelineRecordsEveryItemInOrder) {
  HMOE_REQUIRE_HOPPER_GPU();
  if (!gemm::trace::kCompiled) GTEST_SKIP() << "this build records no GEMM timeline (configure with -DHMOE_GEMM_TRACE=ON)";
  using gemm::trace::Event;
  const std::vector<std::pair<const testkit::LayerWeights*, int>> cases = {
      {&cached_weights("qwen3-30b-a3b"), 7},
      {&cached_weights("qwen3-30b-a3b"), 1000},
      {&cached_fp8_weights("qwen3-30b-a3b", QuantScheme::kBlock128), 4096},
  };
  for (const auto& [weights, num_tokens] : cases) {
    PlanOptions options{num_tokens};
    options.warm_up = false;   // its small launches would take the buffer's first slots
    options.fused_decode = FusedDecode::kOff;
    PlanInfo plan;
    testkit::CheckResult result;
    const std::vector<testkit::LaunchRecords> launches = testkit::record_gemm_timeline(
        [&] { result = run_and_check(*weights, num_tokens, options, &plan); }, nullptr, 1 << 14);
    expect_pass(result, plan, num_tokens);
    ASSERT_EQ(launches.size(), 2u) << "T=" << num_tokens;
    EXPECT_EQ(launches[0].variant, plan.gemm1_kernel);
    EXPECT_EQ(launches[1].variant, plan.gemm2_kernel);
    for (const testkit::LaunchRecords& launch : launches) {
      EXPECT_EQ(launch.dropped, 0) << launch.variant;
      long long items = 0;
      for (std::size_t cta = 0; cta < launch.ctas.size(); ++cta) {
        const auto& roles = launch.ctas[cta];
        std::set<std::uint32_t> issued;
        for (const gemm::trace::Record& record : roles[0]) {
          EXPECT_EQ(record.event, static_cast<std::uint8_t>(Event::kStageIssued));
          issued.insert(record.item);
        }
        std::array<std::set<std::uint32_t>, 2> taken;
        for (int role = 1; role < gemm::trace::kRoles; ++role) {
          std::map<std::uint32_t, std::array<std::uint64_t, 4>> clocks;   // start, first stage, mainloop, epilogue
          for (const gemm::trace::Record& record : roles[role]) {
            if (record.clock == 0) continue;
            ASSERT_GE(record.event, static_cast<std::uint8_t>(Event::kItemStart));
            clocks[record.item][record.event - static_cast<int>(Event::kItemStart)] = record.clock;
          }
          for (const auto& [item, at] : clocks) {
            taken[role - 1].insert(item);
            const std::string where = launch.variant + " CTA " + std::to_string(cta) + " role " +
                                      std::to_string(role) + " item " + std::to_string(item);
            EXPECT_EQ(issued.count(item), 1u) << where;
            EXPECT_NE(at[0], 0u) << where;
            EXPECT_LE(at[0], at[1]) << where;
            EXPECT_LE(at[1], at[2]) << where;
            if (at[3] != 0) EXPECT_LE(at[2], at[3]) << where;   // split K: only the last split has an epilogue
          }
        }
        items += static_cast<long long>(taken[0].size());
        if (!taken[1].empty()) EXPECT_EQ(taken[0], taken[1]) << launch.variant << " CTA " << cta;
      }
      EXPECT_GT(items, 0) << launch.variant;
    }
    std::vector<testkit::LaunchSummary> summaries;
    for (const testkit::LaunchRecords& launch : launches) summaries.push_back(testkit::summarize(launch));
    std::cout << testkit::format_summaries(summaries, 0);
  }
}

// The split along K (PlanOptions::split_k) at decode sizes, forced and by the rule: each matches the
// reference, and a second run (new runner, new workspace) gives the same bits, since the last split
// to arrive sums the partials in split order whoever it is.
TEST(DispatchGpu, SplitAlongKMatchesTheReferenceAndRepeatsBitForBit) {
  HMOE_REQUIRE_HOPPER_GPU();
  for (const char* preset_name : {"qwen3-30b-a3b", "deepseek-v3-tp8", "qwen3-235b-a22b-tp4"}) {
    const testkit::LayerWeights& weights = cached_weights(preset_name);
    for (int num_tokens : {1, 2}) {
      for (int split_k : {0, 2, 3, 8}) {
        PlanOptions options{num_tokens};
        options.split_k = split_k;
        PlanInfo plan;
        std::vector<std::uint16_t> bits[2];
        const testkit::CheckResult result = run_and_check(weights, num_tokens, options, &plan, &bits[0]);
        std::cout << "  " << preset_name << " split_k " << split_k << ": GEMM1 in " << plan.gemm1_splits << ", GEMM2 in "
                  << plan.gemm2_splits << "\n";
        expect_pass(result, plan, num_tokens);
        if (split_k > 1) {
          EXPECT_GT(plan.gemm1_splits, 1) << preset_name << " T=" << num_tokens;
          EXPECT_LE(plan.gemm1_splits, split_k);
        }
        run_and_check(weights, num_tokens, options, &plan, &bits[1]);
        EXPECT_EQ(bits[0], bits[1]) << preset_name << " T=" << num_tokens << " split_k " << split_k;
      }
    }
  }
}

}  // namespace
}  // namespace hmoe::test
