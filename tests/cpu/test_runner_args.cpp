// Host-side argument checking of MoeRunner and the C API: runs without a GPU, since every check
// happens before anything is enqueued.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "hmoe/hmoe.h"
#include "hmoe/hmoe.hpp"

namespace {

// Never dereferenced: the checks under test reject the call (or return for T = 0) first.
void* fake_device_pointer(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

struct RunnerArgsTest : ::testing::Test {
  hmoe::MoeSpec spec = hmoe::preset("qwen3-30b-a3b");
  hmoe::MoeRunner runner{spec, hmoe::PlanOptions{64, hmoe::Orientation::kAuto}};
  hmoe::RunArgs args;
  std::int32_t* ids = static_cast<std::int32_t*>(fake_device_pointer(0x20000));
  float* weights = static_cast<float*>(fake_device_pointer(0x30000));

  void SetUp() override {
    args.num_tokens = 16;
    args.x = fake_device_pointer(0x1000);
    args.out = fake_device_pointer(0x2000);
    args.weights.w13 = fake_device_pointer(0x3000);
    args.weights.w2 = fake_device_pointer(0x4000);
    args.workspace = fake_device_pointer(0x10000);
    args.workspace_size = runner.workspace_bytes();
  }

  std::string error_of_run() {
    try {
      runner.run_from_topk(args, ids, weights, nullptr);
    } catch (const hmoe::Error& error) {
      return error.what();
    }
    return "";
  }
};

TEST_F(RunnerArgsTest, ZeroTokensReturnsWithoutTouchingTheDevice) {
  args.num_tokens = 0;
  EXPECT_NO_THROW(runner.run_from_topk(args, ids, weights, nullptr));
  EXPECT_NO_THROW(runner.run_from_logits(args, fake_device_pointer(0x40000), nullptr));
}

TEST_F(RunnerArgsTest, TokenCountOutOfRangeIsNamed) {
  args.num_tokens = 65;
  EXPECT_NE(error_of_run().find("RunArgs.num_tokens = 65"), std::string::npos) << error_of_run();
  args.num_tokens = -1;
  EXPECT_NE(error_of_run().find("RunArgs.num_tokens = -1"), std::string::npos) << error_of_run();
}

TEST_F(RunnerArgsTest, NullPointersAreNamed) {
  args.x = nullptr;
  EXPECT_NE(error_of_run().find("RunArgs.x is null"), std::string::npos) << error_of_run();
  SetUp();
  args.out = nullptr;
  EXPECT_NE(error_of_run().find("RunArgs.out is null"), std::string::npos) << error_of_run();
  SetUp();
  args.weights.w2 = nullptr;
  EXPECT_NE(error_of_run().find("RunArgs.weights.w2 is null"), std::string::npos) << error_of_run();
  SetUp();
  ids = nullptr;
  EXPECT_NE(error_of_run().find("topk_ids is null"), std::string::npos) << error_of_run();
}

TEST_F(RunnerArgsTest, MisalignedPointersAreRejected) {
  args.x = fake_device_pointer(0x1002);
  EXPECT_NE(error_of_run().find("RunArgs.x"), std::string::npos);
  EXPECT_NE(error_of_run().find("16-byte aligned"), std::string::npos) << error_of_run();
}

TEST_F(RunnerArgsTest, SmallWorkspaceIsRejectedWithTheNeededSize) {
  args.workspace_size = runner.workspace_bytes() - 1;
  const std::string message = error_of_run();
  EXPECT_NE(message.find("RunArgs.workspace_size"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(runner.workspace_bytes())), std::string::npos) << message;
}

// PlanOptions::replay_graphs changes how a checked call is enqueued, never what is checked: the
// same bad arguments are rejected, before any graph work, and T = 0 still touches nothing.
TEST_F(RunnerArgsTest, ReplayGraphsKeepEveryCheck) {
  hmoe::PlanOptions options{64, hmoe::Orientation::kAuto};
  options.replay_graphs = true;
  const hmoe::MoeRunner replaying(spec, options);
  EXPECT_EQ(replaying.graph_count(), 0u);
  const auto error_of = [&](const hmoe::RunArgs& call) -> std::string {
    try {
      replaying.run_from_topk(call, ids, weights, nullptr);
    } catch (const hmoe::Error& error) {
      return error.what();
    }
    return "";
  };
  hmoe::RunArgs call = args;
  call.x = nullptr;
  EXPECT_NE(error_of(call).find("RunArgs.x is null"), std::string::npos) << error_of(call);
  call = args;
  call.workspace_size = replaying.workspace_bytes() - 1;
  EXPECT_NE(error_of(call).find("RunArgs.workspace_size"), std::string::npos) << error_of(call);
  call = args;
  call.num_tokens = 0;
  EXPECT_NO_THROW(replaying.run_from_topk(call, ids, weights, nullptr));
  EXPECT_NO_THROW(replaying.run_from_logits(call, fake_device_pointer(0x40000), nullptr));
  EXPECT_EQ(replaying.graph_count(), 0u);
}

TEST(RunnerPlan, MaxTokensMustBePositive) {
  const hmoe::MoeSpec spec = hmoe::preset("olmoe-1b-7b");
  EXPECT_THROW(hmoe::MoeRunner(spec, hmoe::PlanOptions{0, hmoe::Orientation::kAuto}), hmoe::Error);
}

TEST(RunnerPlan, AutoOrientationSwapsForFewTokensPerExpert) {
  const hmoe::MoeSpec spec = hmoe::preset("qwen3-30b-a3b");   // E = 128, k = 8
  const hmoe::MoeRunner runner(spec, hmoe::PlanOptions{16384, hmoe::Orientation::kAuto});
  EXPECT_EQ(runner.plan_info(1).orientation, hmoe::Orientation::kSwapAB);
  EXPECT_EQ(runner.plan_info(1).token_tile, 8);
  EXPECT_EQ(runner.plan_info(256).orientation, hmoe::Orientation::kSwapAB);   // 16 tokens per expert
  EXPECT_EQ(runner.plan_info(256).token_tile, 32);
  EXPECT_EQ(runner.plan_info(512).orientation, hmoe::Orientation::kNormal);   // 32 tokens per expert
  EXPECT_EQ(runner.plan_info(512).token_tile, 64);
  EXPECT_EQ(runner.plan_info(16384).orientation, hmoe::Orientation::kNormal);
  const hmoe::MoeRunner forced(spec, hmoe::PlanOptions{16384, hmoe::Orientation::kNormal});
  EXPECT_EQ(forced.plan_info(1).orientation, hmoe::Orientation::kNormal);
  std::printf("qwen3-30b-a3b plans: T=1 %s, T=512 %s, T=16384 %s\n", runner.plan_info(1).gemm1_kernel.c_str(),
              runner.plan_info(512).gemm1_kernel.c_str(), runner.plan_info(16384).gemm1_kernel.c_str());
}

TEST(RunnerPlan, WorkspaceGrowsWithMaxTokens) {
  const hmoe::MoeSpec spec = hmoe::preset("deepseek-v3-tp8");
  const hmoe::MoeRunner small(spec, hmoe::PlanOptions{1, hmoe::Orientation::kAuto});
  const hmoe::MoeRunner large(spec, hmoe::PlanOptions{1024, hmoe::Orientation::kAuto});
  // At least the gathered rows and the intermediate: T·k·(H + I) bf16.
  EXPECT_GE(large.workspace_bytes(), 1024ull * 8 * (7168 + 256) * 2);
  EXPECT_LT(small.workspace_bytes(), large.workspace_bytes());
}

TEST(CApi, BadSpecReturnsInvalidArgumentWithMessage) {
  hmoe_spec spec{};
  ASSERT_EQ(hmoe_spec_preset("mixtral-8x7b", &spec), HMOE_OK);
  spec.top_k = 9;   // E = 8
  hmoe_runner* runner = nullptr;
  EXPECT_EQ(hmoe_runner_create(&spec, 16, 0, &runner), HMOE_INVALID_ARGUMENT);
  EXPECT_EQ(runner, nullptr);
  EXPECT_NE(std::string(hmoe_last_error()).find("top_k = 9"), std::string::npos) << hmoe_last_error();
}

TEST(CApi, UnknownPresetAndNullOutputsAreReported) {
  hmoe_spec spec{};
  EXPECT_EQ(hmoe_spec_preset("gpt-5", &spec), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("gpt-5"), std::string::npos);
  EXPECT_EQ(hmoe_spec_preset("olmoe-1b-7b", nullptr), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("spec is null"), std::string::npos);
}

TEST(CApi, RunnerRoundTripAndZeroTokens) {
  hmoe_spec spec{};
  ASSERT_EQ(hmoe_spec_preset("deepseek-v3-tp8", &spec), HMOE_OK);
  EXPECT_EQ(spec.routing_function, 1);
  EXPECT_EQ(spec.num_groups, 8);
  hmoe_runner* runner = nullptr;
  ASSERT_EQ(hmoe_runner_create(&spec, 128, 2, &runner), HMOE_OK) << hmoe_last_error();
  size_t bytes = 0;
  ASSERT_EQ(hmoe_runner_workspace_bytes(runner, &bytes), HMOE_OK);
  EXPECT_GT(bytes, 0u);
  hmoe_run_args args{};
  args.num_tokens = 0;
  args.x = fake_device_pointer(0x1000);
  args.out = fake_device_pointer(0x2000);
  args.w13 = fake_device_pointer(0x3000);
  args.w2 = fake_device_pointer(0x4000);
  args.workspace = fake_device_pointer(0x10000);
  args.workspace_size = bytes;
  EXPECT_EQ(hmoe_run_from_logits(runner, &args, fake_device_pointer(0x5000), nullptr), HMOE_OK) << hmoe_last_error();
  args.workspace_size = bytes - 256;
  EXPECT_EQ(hmoe_run_from_logits(runner, &args, fake_device_pointer(0x5000), nullptr), HMOE_INVALID_ARGUMENT);
  hmoe_runner_destroy(runner);
}

// hmoe_runner_plan_info reports what MoeRunner::plan_info does, field by field: Swap-AB and normal
// plans, the fused decode layer (with who turned it on), chunked runs; bad arguments are named.
TEST(CApi, PlanInfoMatchesTheCppRunner) {
  if (std::getenv("HMOE_FUSED_DECODE") != nullptr) GTEST_SKIP() << "HMOE_FUSED_DECODE is set: it overrides the plans";
  hmoe_spec spec{};
  ASSERT_EQ(hmoe_spec_preset("qwen3-30b-a3b", &spec), HMOE_OK);
  const std::size_t cap = 64u << 20;   // forces chunks at the largest T
  hmoe_plan_options options{8192, 0, cap};
  options.fused_decode = 1;   // on
  hmoe_runner* runner = nullptr;
  ASSERT_EQ(hmoe_runner_create_with_options(&spec, &options, &runner), HMOE_OK) << hmoe_last_error();
  hmoe::PlanOptions cpp_options;
  cpp_options.max_tokens = 8192;
  cpp_options.max_workspace_bytes = cap;
  cpp_options.fused_decode = hmoe::FusedDecode::kOn;
  const hmoe::MoeRunner cpp(hmoe::preset("qwen3-30b-a3b"), cpp_options);
  bool saw_fused = false, saw_swap = false, saw_normal = false, saw_chunks = false;
  for (int tokens : {1, 3, 5, 64, 1000, 8192}) {
    hmoe_plan_info info{};
    ASSERT_EQ(hmoe_runner_plan_info(runner, tokens, &info), HMOE_OK) << hmoe_last_error();
    const hmoe::PlanInfo expected = cpp.plan_info(tokens);
    EXPECT_EQ(info.orientation, static_cast<int>(expected.orientation)) << tokens;
    EXPECT_EQ(info.token_tile, expected.token_tile) << tokens;
    EXPECT_EQ(info.weight_tile, expected.weight_tile) << tokens;
    EXPECT_EQ(info.num_chunks, expected.num_chunks) << tokens;
    EXPECT_EQ(info.gemm1_splits, expected.gemm1_splits) << tokens;
    EXPECT_EQ(info.gemm2_splits, expected.gemm2_splits) << tokens;
    EXPECT_EQ(info.fused_decode, expected.fused_decode ? 1 : 0) << tokens;
    EXPECT_EQ(std::string(info.gemm1_kernel), expected.gemm1_kernel) << tokens;
    EXPECT_EQ(std::string(info.gemm2_kernel), expected.gemm2_kernel) << tokens;
    EXPECT_EQ(std::string(info.source), expected.source) << tokens;
    saw_fused |= info.fused_decode == 1 && std::string(info.source) == "option" && info.gemm2_kernel[0] == '\0';
    saw_swap |= info.fused_decode == 0 && info.orientation == 2;
    saw_normal |= info.orientation == 1;
    saw_chunks |= info.num_chunks > 1;
  }
  EXPECT_TRUE(saw_fused && saw_swap && saw_normal && saw_chunks) << "the sweep covers every kind of plan";
  hmoe_plan_info info{};
  EXPECT_EQ(hmoe_runner_plan_info(runner, 0, &info), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("num_tokens = 0"), std::string::npos) << hmoe_last_error();
  EXPECT_EQ(hmoe_runner_plan_info(runner, 1, nullptr), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("info is null"), std::string::npos) << hmoe_last_error();
  EXPECT_EQ(hmoe_runner_plan_info(nullptr, 1, &info), HMOE_INVALID_ARGUMENT);
  hmoe_runner_destroy(runner);
}

}  // namespace

namespace {

TEST(CApi, PlanOptionsCapTheWorkspaceCarryBatchInvarianceAndSwitches) {
  hmoe_spec spec{};
  ASSERT_EQ(hmoe_spec_preset("deepseek-v3-tp8", &spec), HMOE_OK);
  EXPECT_EQ(spec.batch_invariant, 0);
  hmoe_runner* uncapped = nullptr;
  ASSERT_EQ(hmoe_runner_create(&spec, 65536, 0, &uncapped), HMOE_OK) << hmoe_last_error();
  size_t uncapped_bytes = 0;
  ASSERT_EQ(hmoe_runner_workspace_bytes(uncapped, &uncapped_bytes), HMOE_OK);
  hmoe_runner_destroy(uncapped);

  const size_t cap = 256u << 20;
  hmoe_plan_options options{65536, 0, cap};
  spec.batch_invariant = 1;
  hmoe_runner* capped = nullptr;
  ASSERT_EQ(hmoe_runner_create_with_options(&spec, &options, &capped), HMOE_OK) << hmoe_last_error();
  size_t capped_bytes = 0;
  ASSERT_EQ(hmoe_runner_workspace_bytes(capped, &capped_bytes), HMOE_OK);
  std::printf("deepseek-v3-tp8, T = 65536: workspace %zu bytes uncapped, %zu under a %zu-byte cap\n", uncapped_bytes,
              capped_bytes, cap);
  EXPECT_LE(capped_bytes, cap);
  EXPECT_LT(capped_bytes, uncapped_bytes);
  hmoe_runner_destroy(capped);

  options.orientation = 2;   // batch-invariant mode runs the normal orientation only
  EXPECT_EQ(hmoe_runner_create_with_options(&spec, &options, &capped), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("batch_invariant"), std::string::npos) << hmoe_last_error();
  options.orientation = 3;
  EXPECT_EQ(hmoe_runner_create_with_options(&spec, &options, &capped), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("hmoe_plan_options.orientation = 3"), std::string::npos)
      << hmoe_last_error();
  EXPECT_EQ(hmoe_runner_create_with_options(&spec, nullptr, &capped), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("options is null"), std::string::npos) << hmoe_last_error();

  // Graph replay, the warm-up and the fused decode switches reach the C++ options; values other than
  // 0 and 1 (fused_decode: 0 auto, 1 on, 2 off) are refused.
  options.orientation = 0;
  options.replay_graphs = 1;
  options.no_warm_up = 1;
  for (int fused_decode : {0, 1, 2}) {
    options.fused_decode = fused_decode;
    ASSERT_EQ(hmoe_runner_create_with_options(&spec, &options, &capped), HMOE_OK)
        << "fused_decode = " << fused_decode << ": " << hmoe_last_error();
    hmoe_runner_destroy(capped);
  }
  options.replay_graphs = 2;
  EXPECT_EQ(hmoe_runner_create_with_options(&spec, &options, &capped), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("hmoe_plan_options.replay_graphs = 2"), std::string::npos)
      << hmoe_last_error();
  options.replay_graphs = 0;
  options.no_warm_up = -1;
  EXPECT_EQ(hmoe_runner_create_with_options(&spec, &options, &capped), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("hmoe_plan_options.no_warm_up = -1"), std::string::npos)
      << hmoe_last_error();
  options.no_warm_up = 0;
  for (int fused_decode : {3, -1}) {
    options.fused_decode = fused_decode;
    EXPECT_EQ(hmoe_runner_create_with_options(&spec, &options, &capped), HMOE_INVALID_ARGUMENT);
    const std::string expected = "hmoe_plan_options.fused_decode = " + std::to_string(fused_decode);
    EXPECT_NE(std::string(hmoe_last_error()).find(expected), std::string::npos) << hmoe_last_error();
  }
}

}  // namespace

namespace {

TEST(CApi, Fp8ScaleCountsFollowTheCheckpointLayouts) {
  hmoe_spec spec{};
  ASSERT_EQ(hmoe_spec_preset("qwen3-30b-a3b", &spec), HMOE_OK);   // E 128, H 2048, I 768
  EXPECT_EQ(spec.ue8m0_scales, 0);
  size_t w13 = 1, w2 = 1;
  ASSERT_EQ(hmoe_weight_scale_count(&spec, 0, &w13), HMOE_OK) << hmoe_last_error();
  EXPECT_EQ(w13, 0u);   // bf16: no scales
  spec.weight_dtype = 1;
  const struct {
    int scheme;
    size_t w13, w2;
  } cases[] = {{1, 128, 128},                                  // fp8-tensor [E]
               {2, 128 * 1536, 128 * 2048},                    // fp8-channel [E, N]
               {3, 128 * 12 * 16, 128 * 16 * 6}};              // fp8-block [E, N/128, K/128]
  for (const auto& c : cases) {
    spec.scheme = c.scheme;
    ASSERT_EQ(hmoe_weight_scale_count(&spec, 0, &w13), HMOE_OK) << hmoe_last_error();
    ASSERT_EQ(hmoe_weight_scale_count(&spec, 1, &w2), HMOE_OK) << hmoe_last_error();
    EXPECT_EQ(w13, c.w13) << "scheme " << c.scheme;
    EXPECT_EQ(w2, c.w2) << "scheme " << c.scheme;
  }
  EXPECT_EQ(hmoe_weight_scale_count(&spec, 2, &w13), HMOE_INVALID_ARGUMENT);
  EXPECT_STREQ(hmoe_last_error(), "hmoe: invalid matrix = 2: expected 0..1");
  EXPECT_EQ(hmoe_weight_scale_count(&spec, 0, nullptr), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("count is null"), std::string::npos) << hmoe_last_error();
}

TEST(CApi, Fp8SpecFieldsAndQuantizeArgumentsAreChecked) {
  hmoe_spec spec{};
  ASSERT_EQ(hmoe_spec_preset("qwen3-30b-a3b", &spec), HMOE_OK);
  spec.ue8m0_scales = 1;   // bf16 weights have no scales to round
  hmoe_runner* runner = nullptr;
  EXPECT_EQ(hmoe_runner_create(&spec, 16, 0, &runner), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("ue8m0_scales"), std::string::npos) << hmoe_last_error();
  spec.weight_dtype = 1;
  spec.scheme = 3;
  spec.hidden = 192;       // fp8-block tiles K by 128
  EXPECT_EQ(hmoe_runner_create(&spec, 16, 0, &runner), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("hidden = 192"), std::string::npos) << hmoe_last_error();
  spec.hidden = 2048;
  spec.scheme = 4;
  EXPECT_EQ(hmoe_quantize_weights(&spec, 0, nullptr, nullptr, nullptr, nullptr), HMOE_INVALID_ARGUMENT);
  EXPECT_STREQ(hmoe_last_error(), "hmoe: invalid hmoe_spec.scheme = 4: expected 0..3");
  spec.scheme = 3;
  EXPECT_EQ(hmoe_quantize_weights(&spec, 7, nullptr, nullptr, nullptr, nullptr), HMOE_INVALID_ARGUMENT);
  EXPECT_STREQ(hmoe_last_error(), "hmoe: invalid matrix = 7: expected 0..1");
  EXPECT_EQ(hmoe_quantize_weights(nullptr, 0, nullptr, nullptr, nullptr, nullptr), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("spec is null"), std::string::npos) << hmoe_last_error();
}

}  // namespace

namespace {

TEST(CApi, Fp8RunArgsReachTheRunner) {
  hmoe_spec spec{};
  ASSERT_EQ(hmoe_spec_preset("qwen3-30b-a3b", &spec), HMOE_OK);
  spec.weight_dtype = 1;
  spec.scheme = 3;   // fp8-block
  hmoe_runner* runner = nullptr;
  ASSERT_EQ(hmoe_runner_create(&spec, 64, 0, &runner), HMOE_OK) << hmoe_last_error();
  size_t bytes = 0;
  ASSERT_EQ(hmoe_runner_workspace_bytes(runner, &bytes), HMOE_OK);
  hmoe_run_args args{};
  args.num_tokens = 16;
  args.x = fake_device_pointer(0x1000);
  args.out = fake_device_pointer(0x100000);
  args.w13 = fake_device_pointer(0x200000);
  args.w2 = fake_device_pointer(0x300000);
  args.workspace = fake_device_pointer(0x10000000);
  args.workspace_size = bytes;
  const auto* ids = static_cast<const std::int32_t*>(fake_device_pointer(0x400000));
  const auto* weights = static_cast<const float*>(fake_device_pointer(0x500000));
  EXPECT_EQ(hmoe_run_from_topk(runner, &args, ids, weights, nullptr), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("RunArgs.weights.w13_scale is null"), std::string::npos)
      << hmoe_last_error();
  args.w13_scale = static_cast<const float*>(fake_device_pointer(0x600000));
  EXPECT_EQ(hmoe_run_from_topk(runner, &args, ids, weights, nullptr), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("RunArgs.weights.w2_scale is null"), std::string::npos)
      << hmoe_last_error();
  args.w2_scale = static_cast<const float*>(fake_device_pointer(0x700000));
  args.intermediate_act_scale = static_cast<const float*>(fake_device_pointer(0x800000));
  EXPECT_EQ(hmoe_run_from_topk(runner, &args, ids, weights, nullptr), HMOE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hmoe_last_error()).find("act_scale"), std::string::npos) << hmoe_last_error();
  hmoe_runner_destroy(runner);
}

}  // namespace
