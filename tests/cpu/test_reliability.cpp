// Issue 7 on the host: every documented bad input is rejected with a message naming the argument,
// its value and what was expected (C++ and C API), the workspace cap's chunk arithmetic, and the
// T-independence of the batch-invariant plan. Nothing here needs a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "dispatch/plan.hpp"
#include "hmoe/hmoe.h"
#include "hmoe/hmoe.hpp"

namespace hmoe {
namespace {

// Never dereferenced: each call under test is rejected (or returns for T = 0) before any launch.
// The buffers sit 256 MiB apart so that only the overlaps a test builds on purpose exist.
template <typename T = void>
T* fake_device_pointer(std::uintptr_t slot, std::uintptr_t offset = 0) {
  return reinterpret_cast<T*>((slot << 28) + offset);
}

// PlanOptions with the fields these tests vary (the others at their defaults).
inline PlanOptions plan_options(int max_tokens, Orientation orientation = Orientation::kAuto,
                                std::size_t max_workspace_bytes = 0) {
  PlanOptions options;
  options.max_tokens = max_tokens;
  options.orientation = orientation;
  options.max_workspace_bytes = max_workspace_bytes;
  return options;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// Prints one row of the bad-input table and checks the message holds every expected fragment.
void expect_message(const std::string& input, const std::string& message, const std::vector<std::string>& fragments) {
  std::printf("| %s | %s |\n", input.c_str(), message.c_str());
  ASSERT_FALSE(message.empty()) << input << " was accepted";
  for (const std::string& fragment : fragments)
    EXPECT_NE(message.find(fragment), std::string::npos) << input << ": '" << message << "' lacks '" << fragment << "'";
}

void expect_spec_rejected(const std::string& input, const std::function<void(MoeSpec&)>& change,
                          const std::vector<std::string>& fragments, const char* base = "deepseek-v3-tp8") {
  MoeSpec spec = preset(base);
  change(spec);
  expect_message(input, error_of([&] { validate(spec); }), fragments);
}

TEST(BadInput, SpecFieldsAreNamedWithValueAndExpectation) {
  expect_spec_rejected("MoeSpec.weight_dtype = 7", [](MoeSpec& s) { s.weight_dtype = static_cast<WeightDType>(7); },
                       {"weight_dtype = 7", "expected 0 (bf16) or 1"});
  expect_spec_rejected("MoeSpec.scheme = -1", [](MoeSpec& s) { s.scheme = static_cast<QuantScheme>(-1); },
                       {"scheme = -1", "expected 0 (none)"});
  expect_spec_rejected("MoeSpec.routing.function = 2",
                       [](MoeSpec& s) { s.routing.function = static_cast<RoutingFunction>(2); },
                       {"routing.function = 2", "expected 0 (softmax) or 1 (grouped)"});
  expect_spec_rejected("MoeSpec.routing.logits_dtype = 5",
                       [](MoeSpec& s) { s.routing.logits_dtype = static_cast<LogitsDType>(5); },
                       {"routing.logits_dtype = 5", "expected 0 (fp32) or 1 (bf16)"});
  expect_spec_rejected("MoeSpec.hidden = 65600", [](MoeSpec& s) { s.hidden = kMaxDim + 64; },
                       {"hidden = 65600", "multiple of 64 in 64..65536"});
  expect_spec_rejected("MoeSpec.intermediate = 96", [](MoeSpec& s) { s.intermediate = 96; },
                       {"intermediate = 96", "multiple of 64"});
  expect_spec_rejected("MoeSpec.num_experts = 2048", [](MoeSpec& s) { s.num_experts = 2048; },
                       {"num_experts = 2048", "1..1024"});
  expect_spec_rejected("MoeSpec.top_k = 0", [](MoeSpec& s) { s.top_k = 0; }, {"top_k = 0", "expected 1..min"});
  expect_spec_rejected("MoeSpec.routing.num_groups = 3", [](MoeSpec& s) { s.routing.num_groups = 3; },
                       {"routing.num_groups = 3", "divisor of num_experts=256"});
  expect_spec_rejected("MoeSpec.routing.topk_groups = 9", [](MoeSpec& s) { s.routing.topk_groups = 9; },
                       {"routing.topk_groups = 9", "1..num_groups=8"});
  expect_spec_rejected("MoeSpec.top_k = 9 with 32 groups of 8, topk_groups = 1",
                       [](MoeSpec& s) {
                         s.top_k = 9;
                         s.routing.num_groups = 32;
                         s.routing.topk_groups = 1;
                       },
                       {"top_k = 9", "at most topk_groups × experts per group = 8"});
  expect_spec_rejected("MoeSpec.routing.routed_scaling_factor = nan",
                       [](MoeSpec& s) { s.routing.routed_scaling_factor = std::nanf(""); },
                       {"routed_scaling_factor = nan", "finite value > 0"});
  expect_spec_rejected("MoeSpec.routing.routed_scaling_factor = inf",
                       [](MoeSpec& s) { s.routing.routed_scaling_factor = INFINITY; },
                       {"routed_scaling_factor = inf", "finite value > 0"});
  expect_spec_rejected("fp8 weights without a scheme", [](MoeSpec& s) { s.weight_dtype = WeightDType::kFP8E4M3; },
                       {"scheme = 0", "an FP8 scheme for fp8 weights"});
  expect_spec_rejected("bf16 weights with an FP8 scheme", [](MoeSpec& s) { s.scheme = QuantScheme::kPerTensor; },
                       {"scheme = 1", "kNone for bf16 weights"});
  expect_spec_rejected("bf16 weights with UE8M0 scales", [](MoeSpec& s) { s.ue8m0_scales = true; },
                       {"ue8m0_scales = 1", "false for bf16 weights"});
  expect_spec_rejected("fp8-block with I = 192 (K of GEMM2 not a multiple of 128)",
                       [](MoeSpec& s) {
                         s.weight_dtype = WeightDType::kFP8E4M3;
                         s.scheme = QuantScheme::kBlock128;
                         s.intermediate = 192;
                       },
                       {"intermediate = 192", "multiple of 128 for fp8-block"});
  expect_spec_rejected("fp8-block with H = 2112",
                       [](MoeSpec& s) {
                         s.weight_dtype = WeightDType::kFP8E4M3;
                         s.scheme = QuantScheme::kBlock128;
                         s.hidden = 2112;
                       },
                       {"hidden = 2112", "multiple of 128 for fp8-block"});
}

TEST(BadInput, PlanOptionsAreNamedWithValueAndExpectation) {
  const MoeSpec spec = preset("qwen3-30b-a3b");
  expect_message("PlanOptions.max_tokens = 0", error_of([&] { MoeRunner(spec, plan_options(0)); }),
                 {"max_tokens = 0", "expected 1..1048576"});
  expect_message("PlanOptions.max_tokens = 2^21", error_of([&] { MoeRunner(spec, plan_options(1 << 21)); }),
                 {"max_tokens = 2097152"});
  expect_message("PlanOptions.orientation = 3",
                 error_of([&] { MoeRunner(spec, plan_options(16, static_cast<Orientation>(3))); }),
                 {"orientation = 3", "expected 0 (auto), 1 (normal) or 2 (swap)"});
  expect_message("PlanOptions.max_workspace_bytes = 4096",
                 error_of([&] { MoeRunner(spec, plan_options(16, Orientation::kAuto, 4096)); }),
                 {"max_workspace_bytes = 4096", "at least"});
  MoeSpec invariant = spec;
  invariant.batch_invariant = true;
  expect_message("orientation = swap with batch_invariant",
                 error_of([&] { MoeRunner(invariant, plan_options(16, Orientation::kSwapAB)); }),
                 {"orientation = swap", "batch_invariant", "expected auto or normal"});
}

// A runner with every RunArgs pointer valid; each test breaks one thing.
struct RunArgsFixture : ::testing::Test {
  MoeSpec spec = preset("deepseek-v3-tp8");   // grouped: correction_bias is read
  MoeRunner runner{spec, plan_options(64)};
  RunArgs args;
  const std::int32_t* ids = nullptr;
  const float* weights = nullptr;
  const void* logits = nullptr;

  void SetUp() override {
    ids = fake_device_pointer<const std::int32_t>(6);
    weights = fake_device_pointer<const float>(7);
    logits = fake_device_pointer(8);
    args.num_tokens = 16;
    args.x = fake_device_pointer(1);
    args.out = fake_device_pointer(2);
    args.weights.w13 = fake_device_pointer(3);
    args.weights.w2 = fake_device_pointer(4);
    args.weights.correction_bias = fake_device_pointer<const float>(9);
    args.invalid_id_count = fake_device_pointer<int>(10);
    args.workspace = fake_device_pointer(5);
    args.workspace_size = runner.workspace_bytes();
  }
  std::string from_topk() const { return error_of([&] { runner.run_from_topk(args, ids, weights, nullptr); }); }
  std::string from_logits() const { return error_of([&] { runner.run_from_logits(args, logits, nullptr); }); }
};

TEST_F(RunArgsFixture, EveryBadArgumentIsNamed) {
  args.num_tokens = 65;
  expect_message("RunArgs.num_tokens = 65 (max_tokens 64)", from_topk(), {"num_tokens = 65", "0..max_tokens=64"});
  SetUp();
  args.workspace = nullptr;
  expect_message("RunArgs.workspace = nullptr", from_logits(), {"RunArgs.workspace is null", "expected"});
  SetUp();
  args.workspace = fake_device_pointer(5, 128);
  expect_message("RunArgs.workspace 128-byte aligned", from_logits(), {"RunArgs.workspace = 0x", "256-byte aligned"});
  SetUp();
  args.workspace_size = runner.workspace_bytes() - 1;
  expect_message("RunArgs.workspace_size = workspace_bytes() - 1", from_topk(),
                 {"workspace_size = " + std::to_string(runner.workspace_bytes() - 1),
                  "at least " + std::to_string(runner.workspace_bytes())});
  SetUp();
  args.out = fake_device_pointer(2, 8);
  expect_message("RunArgs.out 8-byte aligned", from_topk(), {"RunArgs.out = 0x", "16-byte aligned"});
  SetUp();
  args.weights.w13 = nullptr;
  expect_message("RunArgs.weights.w13 = nullptr", from_topk(), {"RunArgs.weights.w13 is null"});
  SetUp();
  args.weights.correction_bias = fake_device_pointer<const float>(9, 2);
  expect_message("RunArgs.weights.correction_bias 2-byte aligned", from_logits(),
                 {"correction_bias = 0x", "4-byte aligned"});
  SetUp();
  args.invalid_id_count = fake_device_pointer<int>(10, 1);
  expect_message("RunArgs.invalid_id_count 1-byte aligned", from_topk(), {"invalid_id_count = 0x", "4-byte aligned"});
  SetUp();
  logits = nullptr;
  expect_message("router_logits = nullptr", from_logits(), {"router_logits is null"});
  SetUp();
  logits = fake_device_pointer(8, 2);
  expect_message("router_logits (fp32) 2-byte aligned", from_logits(), {"router_logits = 0x", "4-byte aligned"});
  SetUp();
  weights = nullptr;
  expect_message("topk_weights = nullptr", from_topk(), {"topk_weights is null"});
  SetUp();
  ids = fake_device_pointer<const std::int32_t>(6, 2);
  expect_message("topk_ids 2-byte aligned", from_topk(), {"topk_ids = 0x", "4-byte aligned"});
}

TEST_F(RunArgsFixture, OverlappingBuffersAreNamed) {
  args.out = fake_device_pointer(5, 4096);   // inside the workspace
  expect_message("RunArgs.out inside RunArgs.workspace", from_topk(),
                 {"RunArgs.workspace = 0x", "overlaps RunArgs.out", "expected disjoint"});
  SetUp();
  args.x = fake_device_pointer(2, 1024);   // partly over out
  expect_message("RunArgs.x partly overlapping RunArgs.out", from_topk(), {"RunArgs.out", "overlaps RunArgs.x"});
  SetUp();
  ids = fake_device_pointer<const std::int32_t>(5, 256);
  expect_message("topk_ids inside RunArgs.workspace", from_topk(), {"overlaps topk_ids"});
  SetUp();
  logits = fake_device_pointer(2, 512);
  expect_message("router_logits overlapping RunArgs.out", from_logits(), {"RunArgs.out", "overlaps router_logits"});
  SetUp();
  args.invalid_id_count = fake_device_pointer<int>(2, 64);
  expect_message("invalid_id_count inside RunArgs.out", from_topk(), {"overlaps RunArgs.invalid_id_count"});
}

TEST_F(RunArgsFixture, ZeroTokensAcceptsOptionalNullsAndNarrowBf16Logits) {
  args.num_tokens = 0;
  args.weights.correction_bias = nullptr;   // means zeros
  args.invalid_id_count = nullptr;          // no counting
  EXPECT_NO_THROW(runner.run_from_topk(args, ids, weights, nullptr));
  MoeSpec bf16_logits = spec;
  bf16_logits.routing.logits_dtype = LogitsDType::kBFloat16;
  const MoeRunner bf16_runner(bf16_logits, plan_options(64));
  args.workspace_size = bf16_runner.workspace_bytes();
  EXPECT_NO_THROW(bf16_runner.run_from_logits(args, fake_device_pointer(8, 2), nullptr))
      << "bf16 logits need only 2-byte alignment";
}

// FP8 layers: the weight scales are required, static activation scales belong to fp8-tensor only,
// and scales must not overlap what a run writes.
TEST(BadInput, Fp8RunArgsAreNamed) {
  MoeSpec spec = preset("qwen3-30b-a3b");
  spec.weight_dtype = WeightDType::kFP8E4M3;
  spec.scheme = QuantScheme::kBlock128;
  const MoeRunner runner(spec, plan_options(16));
  RunArgs args;
  args.num_tokens = 16;
  args.x = fake_device_pointer(1);
  args.out = fake_device_pointer(2);
  args.weights.w13 = fake_device_pointer(3);
  args.weights.w2 = fake_device_pointer(4);
  args.workspace = fake_device_pointer(5);
  args.workspace_size = runner.workspace_bytes();
  const auto* ids = fake_device_pointer<const std::int32_t>(6);
  const auto* weights = fake_device_pointer<const float>(7);
  const auto run = [&] { return error_of([&] { runner.run_from_topk(args, ids, weights, nullptr); }); };
  expect_message("fp8 without w13_scale", run(), {"RunArgs.weights.w13_scale is null"});
  args.weights.w13_scale = fake_device_pointer<const float>(8);
  expect_message("fp8 without w2_scale", run(), {"RunArgs.weights.w2_scale is null"});
  args.weights.w2_scale = fake_device_pointer<const float>(9, 2);
  expect_message("w2_scale 2-byte aligned", run(), {"w2_scale = 0x", "4-byte aligned"});
  args.weights.w2_scale = fake_device_pointer<const float>(9);
  args.act_scale = fake_device_pointer<const float>(10);
  expect_message("act_scale with fp8-block", run(), {"act_scale", "fp8-block", "fp8-tensor only"});
  args.act_scale = nullptr;
  args.weights.w13_scale = fake_device_pointer<const float>(2, 64);   // inside out
  expect_message("w13_scale inside RunArgs.out", run(), {"RunArgs.out", "overlaps RunArgs.weights.w13_scale"});

  const MoeSpec bf16 = preset("qwen3-30b-a3b");
  const MoeRunner bf16_runner(bf16, plan_options(16));
  args.workspace_size = bf16_runner.workspace_bytes();
  args.weights.w13_scale = fake_device_pointer<const float>(8);
  expect_message("scales for a bf16 layer", error_of([&] { bf16_runner.run_from_topk(args, ids, weights, nullptr); }),
                 {"w13_scale/w2_scale are set for a bf16 layer"});
}

// fp8-tensor's dynamic scales cover the whole batch: batch-invariant or chunked runs must pass
// static scales, and say so instead of quietly using per-chunk scales.
TEST(BadInput, DynamicTensorScalesNeedTheWholeBatch) {
  MoeSpec spec = preset("qwen3-30b-a3b");
  spec.weight_dtype = WeightDType::kFP8E4M3;
  spec.scheme = QuantScheme::kPerTensor;
  RunArgs args;
  args.num_tokens = 16;
  args.x = fake_device_pointer(1);
  args.out = fake_device_pointer(2);
  args.weights.w13 = fake_device_pointer(3);
  args.weights.w2 = fake_device_pointer(4);
  args.weights.w13_scale = fake_device_pointer<const float>(8);
  args.weights.w2_scale = fake_device_pointer<const float>(9);
  args.workspace = fake_device_pointer(5);
  const auto* ids = fake_device_pointer<const std::int32_t>(6);
  const auto* weights = fake_device_pointer<const float>(7);

  MoeSpec invariant = spec;
  invariant.batch_invariant = true;
  const MoeRunner invariant_runner(invariant, plan_options(16));
  args.workspace_size = invariant_runner.workspace_bytes();
  expect_message("batch-invariant fp8-tensor with dynamic scales",
                 error_of([&] { invariant_runner.run_from_topk(args, ids, weights, nullptr); }),
                 {"batch_invariant", "static activation scales"});

  const std::size_t four_tokens = dispatch::workspace_layout(spec, 4).total;
  const MoeRunner chunked(spec, plan_options(16, Orientation::kAuto, four_tokens));
  ASSERT_EQ(chunked.chunk_tokens(), 4);
  args.workspace_size = chunked.workspace_bytes();
  expect_message("chunked fp8-tensor with dynamic scales",
                 error_of([&] { chunked.run_from_topk(args, ids, weights, nullptr); }),
                 {"num_tokens = 16 runs in chunks of 4", "need static scales"});
  // Only the intermediate's scale static is still dynamic for x: rejected the same way.
  args.intermediate_act_scale = fake_device_pointer<const float>(11);
  expect_message("chunked fp8-tensor with a dynamic x scale",
                 error_of([&] { chunked.run_from_topk(args, ids, weights, nullptr); }), {"need static scales"});
}

TEST(BadInput, QuantizeWeightsNamesItsArguments) {
  MoeSpec spec = preset("qwen3-30b-a3b");
  expect_message("quantize_weights on a bf16 spec",
                 error_of([&] { quantize_weights(spec, WeightMatrix::kW13, fake_device_pointer(1), fake_device_pointer<void>(2),
                                                 fake_device_pointer<float>(3), nullptr); }),
                 {"quantize_weights", "expected an FP8 spec"});
  spec.weight_dtype = WeightDType::kFP8E4M3;
  spec.scheme = QuantScheme::kPerChannelPerToken;
  expect_message("quantize_weights without scales",
                 error_of([&] { quantize_weights(spec, WeightMatrix::kW2, fake_device_pointer(1), fake_device_pointer<void>(2),
                                                 nullptr, nullptr); }),
                 {"quantize_weights: scales is null"});
  EXPECT_EQ(weight_scale_count(spec, WeightMatrix::kW13), 128u * 2 * 768);
  spec.scheme = QuantScheme::kBlock128;
  EXPECT_EQ(weight_scale_count(spec, WeightMatrix::kW13), 128u * 12 * 16);   // [E, 2I/128, H/128]
  EXPECT_EQ(weight_scale_count(spec, WeightMatrix::kW2), 128u * 16 * 6);     // [E, H/128, I/128]
  spec.scheme = QuantScheme::kPerTensor;
  EXPECT_EQ(weight_scale_count(spec, WeightMatrix::kW2), 128u);
  EXPECT_EQ(weight_scale_count(preset("qwen3-30b-a3b"), WeightMatrix::kW2), 0u);
}

TEST(BadInput, CApiReturnsStatusAndTheSameMessage) {
  hmoe_spec spec{};
  ASSERT_EQ(hmoe_spec_preset("qwen3-30b-a3b", &spec), HMOE_OK);
  spec.hidden = 100;
  hmoe_runner* runner = nullptr;
  EXPECT_EQ(hmoe_runner_create(&spec, 16, 0, &runner), HMOE_INVALID_ARGUMENT);
  expect_message("C: hmoe_spec.hidden = 100", hmoe_last_error(), {"hidden = 100", "multiple of 64"});
  spec.hidden = 2048;
  spec.logits_dtype = 4;
  EXPECT_EQ(hmoe_runner_create(&spec, 16, 0, &runner), HMOE_INVALID_ARGUMENT);
  expect_message("C: hmoe_spec.logits_dtype = 4", hmoe_last_error(), {"logits_dtype = 4", "expected 0..1"});
  spec.logits_dtype = 0;
  ASSERT_EQ(hmoe_runner_create(&spec, 16, 0, &runner), HMOE_OK) << hmoe_last_error();
  std::size_t bytes = 0;
  ASSERT_EQ(hmoe_runner_workspace_bytes(runner, &bytes), HMOE_OK);

  hmoe_run_args args{};
  args.num_tokens = 16;
  args.x = fake_device_pointer(1);
  args.out = fake_device_pointer(2);
  args.w13 = fake_device_pointer(3);
  args.w2 = fake_device_pointer(4);
  args.workspace = nullptr;
  args.workspace_size = bytes;
  EXPECT_EQ(hmoe_run_from_logits(runner, &args, fake_device_pointer(8), nullptr), HMOE_INVALID_ARGUMENT);
  expect_message("C: hmoe_run_args.workspace = NULL", hmoe_last_error(), {"RunArgs.workspace is null"});
  args.workspace = fake_device_pointer(5);
  args.out = fake_device_pointer(5, 256);
  EXPECT_EQ(hmoe_run_from_topk(runner, &args, fake_device_pointer<const std::int32_t>(6),
                               fake_device_pointer<const float>(7), nullptr),
            HMOE_INVALID_ARGUMENT);
  expect_message("C: hmoe_run_args.out inside workspace", hmoe_last_error(), {"overlaps RunArgs.out"});
  EXPECT_EQ(hmoe_run_from_topk(runner, nullptr, nullptr, nullptr, nullptr), HMOE_INVALID_ARGUMENT);
  expect_message("C: args = NULL", hmoe_last_error(), {"args is null"});
  hmoe_runner_destroy(runner);
}

// ---- Bounded memory ------------------------------------------------------------------------

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(WorkspaceCap, DeepSeekAt65536TokensFitsTheCapExactly) {
  const MoeSpec spec = preset("deepseek-v3-tp8");
  const std::size_t cap = 256 * kMiB;
  const MoeRunner runner(spec, plan_options(65536, Orientation::kAuto, cap));
  const int chunk = runner.chunk_tokens();
  std::printf("deepseek-v3-tp8, T = 65536, cap 256 MiB: %d tokens per chunk, %d chunks, workspace %zu bytes "
              "(uncapped %zu)\n",
              chunk, runner.plan_info(65536).num_chunks, runner.workspace_bytes(),
              dispatch::workspace_layout(spec, 65536).total);
  EXPECT_LE(runner.workspace_bytes(), cap);
  EXPECT_EQ(runner.workspace_bytes(), dispatch::workspace_layout(spec, chunk).total) << "the size query is exact";
  EXPECT_GT(dispatch::workspace_layout(spec, chunk + 1).total, cap) << "the chunk is the largest that fits";
  EXPECT_EQ(runner.plan_info(65536).num_chunks, (65536 + chunk - 1) / chunk);
  EXPECT_EQ(runner.plan_info(chunk).num_chunks, 1);
  EXPECT_EQ(runner.plan_info(chunk + 1).num_chunks, 2);
  // ~119 KB per token (k · (H + I) bf16 rows plus the small per-slot arrays).
  EXPECT_GT(chunk, 2000);
  EXPECT_LT(chunk, 2300);
}

TEST(WorkspaceCap, NoCapOrALooseCapChangesNothing) {
  const MoeSpec spec = preset("qwen3-30b-a3b");
  const MoeRunner uncapped(spec, plan_options(4096));
  const MoeRunner loose(spec, plan_options(4096, Orientation::kAuto, uncapped.workspace_bytes()));
  EXPECT_EQ(uncapped.chunk_tokens(), 4096);
  EXPECT_EQ(loose.chunk_tokens(), 4096);
  EXPECT_EQ(loose.workspace_bytes(), uncapped.workspace_bytes());
  const MoeRunner one_short(spec, plan_options(4096, Orientation::kAuto, uncapped.workspace_bytes() - 1));
  EXPECT_LT(one_short.chunk_tokens(), 4096);
  EXPECT_LE(one_short.workspace_bytes(), uncapped.workspace_bytes() - 1);
}

TEST(WorkspaceCap, ChunkIsTheLargestFittingCountForEveryCap) {
  for (const std::string& name : preset_names()) {
    const MoeSpec spec = preset(name);
    const std::size_t one_token = dispatch::workspace_layout(spec, 1).total;
    EXPECT_NO_THROW(MoeRunner(spec, plan_options(1000, Orientation::kAuto, one_token))) << name;
    EXPECT_EQ(MoeRunner(spec, plan_options(1000, Orientation::kAuto, one_token)).chunk_tokens(), 1) << name;
    EXPECT_THROW(MoeRunner(spec, plan_options(1000, Orientation::kAuto, one_token - 1)), Error) << name;
    for (int tokens : {1, 2, 3, 7, 64, 333, 999}) {
      const std::size_t cap = dispatch::workspace_layout(spec, tokens).total;
      const int chunk = dispatch::chunk_tokens(spec, 1000, cap);
      EXPECT_GE(chunk, tokens) << name << " cap of " << tokens << " tokens";
      EXPECT_LE(dispatch::workspace_layout(spec, chunk).total, cap) << name;
      if (chunk < 1000) {
        EXPECT_GT(dispatch::workspace_layout(spec, chunk + 1).total, cap) << name;
      }
    }
  }
}

// ---- Batch invariance ----------------------------------------------------------------------

TEST(BatchInvariant, OnePlanForEveryTokenCount) {
  for (const std::string& name : preset_names()) {
    MoeSpec spec = preset(name);
    spec.batch_invariant = true;
    for (Orientation orientation : {Orientation::kAuto, Orientation::kNormal}) {
      const MoeRunner runner(spec, plan_options(65536, orientation, 64 * kMiB));
      const PlanInfo first = runner.plan_info(1);
      EXPECT_EQ(first.orientation, Orientation::kNormal) << name;
      EXPECT_EQ(first.token_tile, 64) << name;
      EXPECT_EQ(first.weight_tile, 128) << name;
      for (int tokens = 1; tokens <= 65536; tokens = tokens * 3 + 1) {
        const PlanInfo plan = runner.plan_info(tokens);
        EXPECT_EQ(plan.gemm1_kernel, first.gemm1_kernel) << name << " T=" << tokens;
        EXPECT_EQ(plan.gemm2_kernel, first.gemm2_kernel) << name << " T=" << tokens;
      }
    }
  }
  MoeSpec spec = preset("qwen3-30b-a3b");
  spec.batch_invariant = true;
  std::printf("batch-invariant plan: %s + %s\n", MoeRunner(spec, plan_options(1)).plan_info(1).gemm1_kernel.c_str(),
              MoeRunner(spec, plan_options(1)).plan_info(1).gemm2_kernel.c_str());
}

TEST(BatchInvariant, OffByDefault) {
  EXPECT_FALSE(MoeSpec{}.batch_invariant);
  EXPECT_EQ(PlanOptions().max_workspace_bytes, 0u);
}

}  // namespace
}  // namespace hmoe
