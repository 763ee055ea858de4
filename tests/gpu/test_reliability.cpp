// Issue 7 on the GPU: documented behaviour for bad device-side data (NaN/Inf activations, NaN,
// negative or zero routing weights, NaN logits), hostile routing (E = 1, k = E, one busy expert,
// odd and huge T), the workspace cap's chunked runs, batch invariance, determinism across graph
// replays, and in-place runs (out == x).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch/plan.hpp"
#include "reliability_support.hpp"

namespace hmoe::test {
namespace {

using testkit::DeviceBuffer;
using testkit::Entry;
using testkit::RoutingMode;

constexpr std::uint16_t kBf16Nan = 0x7FC0;
constexpr std::uint16_t kBf16PlusInf = 0x7F80;
constexpr std::uint16_t kBf16MinusInf = 0xFF80;
constexpr std::size_t kMiB = std::size_t{1} << 20;

MoeSpec softmax_spec(int experts, int top_k, int hidden, int intermediate) {
  MoeSpec spec;
  spec.num_experts = experts;
  spec.top_k = top_k;
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.routing.function = RoutingFunction::kSoftmaxTopK;
  spec.routing.renormalize = true;
  return spec;
}

// The small custom shapes of issue 7, by name: weights generated once per test binary.
MoeSpec custom_spec(const std::string& name) {
  if (name == "e1") return softmax_spec(1, 1, 256, 128);
  if (name == "e8-k8") return softmax_spec(8, 8, 256, 128);
  // Experts whose w13 (64 MB) and w2 (32 MB) exceed half of Hopper's L2: the normal-orientation
  // GEMMs interleave their token tiles in groups (PersistentScheduler, launch_expert_gemm).
  if (name == "e4-wide") return softmax_spec(4, 2, 4096, 4096);
  return softmax_spec(16, 1, 512, 256);   // "e16-k1"
}

bool is_custom(const std::string& name) {
  return name == "e1" || name == "e8-k8" || name == "e16-k1" || name == "e4-wide";
}

const testkit::LayerWeights& weights_for(const std::string& name) {
  if (!is_custom(name)) return cached_weights(name);
  static std::map<std::string, std::unique_ptr<testkit::LayerWeights>> cache;
  std::unique_ptr<testkit::LayerWeights>& entry = cache[name];
  if (!entry) {
    const testkit::Stream stream;
    entry = std::make_unique<testkit::LayerWeights>(
        testkit::make_layer_weights(custom_spec(name), kWeightSeed, /*keep_host_copy=*/true, stream.get()));
  }
  return *entry;
}

int zero_counter_and_read(DeviceBuffer& counter, cudaStream_t stream, bool zero) {
  if (zero) {
    HMOE_CUDA_CHECK(cudaMemsetAsync(counter.get(), 0, sizeof(int), stream));
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return 0;
  }
  return testkit::copy_to_host<int>(counter.get(), 1, stream)[0];
}

bool row_all_nonfinite(const std::vector<std::uint16_t>& out, int token, int hidden) {
  for (int column = 0; column < hidden; ++column)
    if (std::isfinite(reference::bf16_to_float(out[static_cast<std::size_t>(token) * hidden + column]))) return false;
  return true;
}

bool row_all_zero(const std::vector<std::uint16_t>& out, int token, int hidden) {
  for (int column = 0; column < hidden; ++column)
    if (reference::bf16_to_float(out[static_cast<std::size_t>(token) * hidden + column]) != 0.0f) return false;
  return true;
}

// Every token not in `bad` has the same output bits in both runs.
void expect_other_rows_identical(const std::vector<std::uint16_t>& clean, const std::vector<std::uint16_t>& dirty,
                                 int num_tokens, int hidden, const std::vector<int>& bad, const std::string& what) {
  for (int token = 0; token < num_tokens; ++token) {
    if (std::find(bad.begin(), bad.end(), token) != bad.end()) continue;
    EXPECT_EQ(rows_differing(clean, token, dirty, token, 1, hidden), 0)
        << what << ": token " << token << " changed although only tokens with bad data changed";
  }
}

std::vector<int> all_tokens_but(int num_tokens, const std::vector<int>& excluded) {
  std::vector<int> tokens;
  for (int token = 0; token < num_tokens; ++token)
    if (std::find(excluded.begin(), excluded.end(), token) == excluded.end()) tokens.push_back(token);
  return tokens;
}

// ---- Bad device-side data -------------------------------------------------------------------

TEST(DeviceBadData, NanAndInfActivationsStayInTheirToken) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::LayerWeights& weights = cached_weights("qwen3-30b-a3b");
  const int hidden = weights.spec.hidden;
  const testkit::Stream stream;
  const int num_tokens = 64;
  for (Orientation orientation : {Orientation::kNormal, Orientation::kSwapAB}) {
    testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, num_tokens, Entry::kLogits, {RoutingMode::kUniform, 1, 11}, stream.get());
    const Rig rig(weights.spec, plan_options(num_tokens, orientation));
    const std::vector<std::uint16_t> clean = rig.run(weights, inputs, stream.get());
    std::vector<std::uint16_t> x = x_bits(weights, inputs, stream.get());
    const std::vector<int> bad = {5, 9, 10};
    x[5 * hidden + 17] = kBf16Nan;
    x[9 * hidden + 0] = kBf16PlusInf;
    x[10 * hidden + hidden - 1] = kBf16MinusInf;
    testkit::copy_to_device(inputs.x.get(), x, stream.get());
    const std::vector<std::uint16_t> dirty = rig.run(weights, inputs, stream.get());
    const std::string what = "NaN/Inf in x, " + to_string(orientation);
    for (int token : bad) EXPECT_TRUE(row_all_nonfinite(dirty, token, hidden)) << what << ": token " << token;
    expect_other_rows_identical(clean, dirty, num_tokens, hidden, bad, what);
    const reference::Routing routing = testkit::host_routing(weights, inputs, stream.get());
    const double error = rel_error_on(weights, x, routing, dirty, all_tokens_but(num_tokens, bad));
    std::cout << "  " << what << ": bad tokens non-finite, others bit-identical, rel_err " << error << "\n";
    EXPECT_LE(error, testkit::kBf16Tolerance) << what;
  }
}

TEST(DeviceBadData, NanNegativeAndZeroRoutingWeightsAreUsedAsGiven) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::LayerWeights& weights = cached_weights("qwen3-30b-a3b");
  const int hidden = weights.spec.hidden;
  const int k = weights.spec.top_k;
  const testkit::Stream stream;
  const int num_tokens = 16;
  testkit::LayerInputs inputs =
      testkit::make_layer_inputs(weights, num_tokens, Entry::kTopK, {RoutingMode::kUniform, 1, 12}, stream.get());
  const Rig rig(weights.spec, plan_options(num_tokens));
  const std::vector<std::uint16_t> clean = rig.run(weights, inputs, stream.get());
  reference::Routing routing = testkit::host_routing(weights, inputs, stream.get());
  routing.weights[3 * k + 0] = std::nanf("");           // token 3: one NaN weight
  routing.weights[4 * k + 1] = -0.75f;                  // token 4: one negative weight
  for (int slot = 0; slot < k; ++slot) routing.weights[6 * k + slot] = 0.0f;   // token 6: all zero
  testkit::copy_to_device(inputs.topk_weights.get(), routing.weights, stream.get());
  const std::vector<std::uint16_t> dirty = rig.run(weights, inputs, stream.get());

  EXPECT_TRUE(row_all_nonfinite(dirty, 3, hidden)) << "a NaN weight makes its token's row NaN";
  EXPECT_TRUE(row_all_zero(dirty, 6, hidden)) << "all-zero weights give a zero row";
  expect_other_rows_identical(clean, dirty, num_tokens, hidden, {3, 4, 6}, "bad routing weights");
  const std::vector<std::uint16_t> x = x_bits(weights, inputs, stream.get());
  const double negative_error = rel_error_on(weights, x, routing, dirty, {4});
  const double others_error = rel_error_on(weights, x, routing, dirty, all_tokens_but(num_tokens, {3, 6}));
  std::cout << "  negative weight token rel_err " << negative_error << ", all but the NaN/zero tokens "
            << others_error << "\n";
  EXPECT_LE(negative_error, testkit::kBf16Tolerance) << "a negative weight multiplies its expert's row";
  EXPECT_LE(others_error, testkit::kBf16Tolerance);
}

// The ids and weights the routing kernel wrote for one token (the workspace's routing region).
reference::Routing routed_by_gpu(const Rig& rig, const MoeSpec& spec, int num_tokens, cudaStream_t stream) {
  const dispatch::WorkspaceLayout layout = dispatch::workspace_layout(spec, rig.runner.chunk_tokens());
  const auto* base = static_cast<const std::uint8_t*>(rig.workspace.get());
  reference::Routing routing;
  routing.num_tokens = num_tokens;
  routing.top_k = spec.top_k;
  const std::size_t slots = static_cast<std::size_t>(num_tokens) * spec.top_k;
  routing.ids = testkit::copy_to_host<std::int32_t>(base + layout.topk_ids, slots, stream);
  routing.weights = testkit::copy_to_host<float>(base + layout.topk_weights, slots, stream);
  return routing;
}

TEST(DeviceBadData, NanLogits) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream;
  const int num_tokens = 16;
  for (const char* preset_name : {"qwen3-30b-a3b", "deepseek-v3-tp8"}) {
    const testkit::LayerWeights& weights = cached_weights(preset_name);
    const MoeSpec& spec = weights.spec;
    const int hidden = spec.hidden, experts = spec.num_experts, k = spec.top_k;
    const bool grouped = spec.routing.function == RoutingFunction::kGroupedSigmoidTopK;
    testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, num_tokens, Entry::kLogits, {RoutingMode::kUniform, 1, 13}, stream.get());
    const Rig rig(spec, plan_options(num_tokens));
    DeviceBuffer counter(sizeof(int));
    zero_counter_and_read(counter, stream.get(), true);
    const std::vector<std::uint16_t> clean = rig.run(weights, inputs, stream.get(), counter.as<int>());
    const reference::Routing clean_routing = routed_by_gpu(rig, spec, num_tokens, stream.get());
    ASSERT_EQ(zero_counter_and_read(counter, stream.get(), false), 0);

    // Token 2: its first choice's logit becomes NaN. Token 7: every logit NaN.
    std::vector<float> logits = testkit::copy_to_host<float>(inputs.router_logits.get(),
                                                             static_cast<std::size_t>(num_tokens) * experts, stream.get());
    const int first_choice = clean_routing.ids[2 * k];
    logits[2 * experts + first_choice] = std::nanf("");
    for (int e = 0; e < experts; ++e) logits[7 * experts + e] = std::nanf("");
    testkit::copy_to_device(inputs.router_logits.get(), logits, stream.get());
    const std::vector<std::uint16_t> dirty = rig.run(weights, inputs, stream.get(), counter.as<int>());
    const reference::Routing routing = routed_by_gpu(rig, spec, num_tokens, stream.get());
    const std::string what = std::string(preset_name) + " NaN logits";

    for (int slot = 0; slot < k; ++slot) EXPECT_EQ(routing.ids[7 * k + slot], -1) << what << ": all-NaN token";
    EXPECT_EQ(zero_counter_and_read(counter, stream.get(), false), k) << what << ": the k unrouted slots are counted";
    EXPECT_TRUE(row_all_zero(dirty, 7, hidden)) << what << ": an all-NaN token routes nowhere";
    for (int slot = 0; slot < k; ++slot)
      EXPECT_NE(routing.ids[2 * k + slot], first_choice) << what << ": a NaN logit's expert is never chosen";
    if (grouped) {
      // Grouped routing ranks by sigmoid + bias and weighs by the chosen sigmoids: the NaN expert
      // drops out and the rest is normal routing.
      const std::vector<std::uint16_t> x = x_bits(weights, inputs, stream.get());
      EXPECT_FALSE(row_all_nonfinite(dirty, 2, hidden));
      const double error = rel_error_on(weights, x, routing, dirty, {2});
      std::cout << "  " << what << ": token 2 (NaN first choice) rel_err " << error << " vs its GPU routing\n";
      EXPECT_LE(error, testkit::kBf16Tolerance) << what;
    } else {
      // Softmax: the NaN enters the normaliser, so every weight of that token is NaN.
      EXPECT_TRUE(row_all_nonfinite(dirty, 2, hidden)) << what << ": a NaN logit makes the softmax NaN";
    }
    expect_other_rows_identical(clean, dirty, num_tokens, hidden, {2, 7}, what);
  }
}

// ---- Hostile routing ------------------------------------------------------------------------

struct HostileCase {
  std::string name;   // preset or custom shape (see custom_spec)
  int num_tokens = 0;
  RoutingMode routing = RoutingMode::kUniform;
  Entry entry = Entry::kLogits;
  Orientation orientation = Orientation::kAuto;
};

std::vector<HostileCase> hostile_cases() {
  std::vector<HostileCase> cases;
  for (const char* name : {"e1", "e8-k8"}) {
    for (int tokens : {1, 3, 7, 64, 1001}) {
      for (Orientation orientation : {Orientation::kNormal, Orientation::kSwapAB, Orientation::kAuto})
        cases.push_back({name, tokens, RoutingMode::kUniform, Entry::kLogits, orientation});
      cases.push_back({name, tokens, RoutingMode::kUniform, Entry::kTopK, Orientation::kAuto});
    }
    cases.push_back({name, 1001, RoutingMode::kExtreme, Entry::kLogits, Orientation::kAuto});
  }
  // T·k > 8192 takes the multi-kernel permute path; 2049 tokens per expert fill 128-token tiles.
  cases.push_back({"e8-k8", 2049, RoutingMode::kZipf, Entry::kTopK, Orientation::kAuto});
  cases.push_back({"e8-k8", 2049, RoutingMode::kUniform, Entry::kLogits, Orientation::kSwapAB});
  // Grouped token tiles: skewed routing leaves a last group shorter than the others.
  cases.push_back({"e4-wide", 777, RoutingMode::kZipf, Entry::kTopK, Orientation::kNormal});
  cases.push_back({"e4-wide", 2001, RoutingMode::kUniform, Entry::kLogits, Orientation::kNormal});
  for (const char* name : {"qwen3-30b-a3b", "deepseek-v3-tp8", "olmoe-1b-7b"}) {
    for (int tokens : {3, 1001}) {
      for (Orientation orientation : {Orientation::kNormal, Orientation::kSwapAB, Orientation::kAuto})
        cases.push_back({name, tokens, RoutingMode::kUniform, Entry::kLogits, orientation});
      cases.push_back({name, tokens, RoutingMode::kZipf, Entry::kTopK, Orientation::kAuto});
    }
  }
  cases.push_back({"qwen3-30b-a3b", 65536, RoutingMode::kUniform, Entry::kLogits, Orientation::kAuto});
  cases.push_back({"qwen3-30b-a3b", 65536, RoutingMode::kExtreme, Entry::kTopK, Orientation::kAuto});
  return cases;
}

void PrintTo(const HostileCase& c, std::ostream* os) {
  *os << c.name << " T=" << c.num_tokens << " " << testkit::to_string(c.routing) << " " << testkit::to_string(c.entry)
      << " " << to_string(c.orientation);
}

std::string hostile_case_name(const testing::TestParamInfo<HostileCase>& info) {
  const HostileCase& c = info.param;
  std::string name = c.name + "_T" + std::to_string(c.num_tokens) + "_" + testkit::to_string(c.routing) + "_" +
                     testkit::to_string(c.entry) + "_" + to_string(c.orientation);
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

class HostileRouting : public testing::TestWithParam<HostileCase> {};

TEST_P(HostileRouting, MatchesReference) {
  HMOE_REQUIRE_HOPPER_GPU();
  const HostileCase& c = GetParam();
  const testkit::LayerWeights& weights = weights_for(c.name);
  testkit::CheckOptions options;
  options.num_tokens = c.num_tokens;
  options.routing = c.routing;
  options.entry = c.entry;
  options.orientation = c.orientation;
  options.seed = 700 + c.num_tokens;
  options.max_reference_tokens = reference_token_budget(weights.spec);
  const testkit::CheckResult result = testkit::check_layer(weights, options);
  std::ostringstream what;
  PrintTo(c, &what);
  expect_close_to_reference(result, what.str());
  if (c.orientation != Orientation::kAuto) {
    EXPECT_EQ(result.plan.orientation, c.orientation);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, HostileRouting, testing::ValuesIn(hostile_cases()), hostile_case_name);

// Every (token, slot) to one expert: with k = 1 all experts but one are empty; with k = 8 every
// slot of every token names the same expert (k rows per token in one expert, summed by combine).
TEST(HostileRoutingOneExpert, AllSlotsToOneExpert) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream;
  for (const auto& [name, num_tokens, expert] :
       {std::tuple<const char*, int, int>{"e16-k1", 1000, 5}, {"qwen3-30b-a3b", 257, 7}}) {
    const testkit::LayerWeights& weights = weights_for(name);
    for (Orientation orientation : {Orientation::kNormal, Orientation::kSwapAB, Orientation::kAuto}) {
      testkit::LayerInputs inputs =
          testkit::make_layer_inputs(weights, num_tokens, Entry::kTopK, {RoutingMode::kUniform, 1, 14}, stream.get());
      reference::Routing routing = testkit::host_routing(weights, inputs, stream.get());
      std::fill(routing.ids.begin(), routing.ids.end(), expert);
      testkit::copy_to_device(inputs.topk_ids.get(), routing.ids, stream.get());
      const Rig rig(weights.spec, plan_options(num_tokens, orientation));
      const std::vector<std::uint16_t> out = rig.run(weights, inputs, stream.get());
      testkit::CheckResult result = testkit::compare_with_reference(
          weights, x_bits(weights, inputs, stream.get()), routing, out, reference_token_budget(weights.spec), 15);
      result.plan = rig.runner.plan_info(num_tokens);
      expect_close_to_reference(result, std::string(name) + " every slot to expert " + std::to_string(expert) + ", " +
                                            to_string(orientation));
    }
  }
}

// ---- Bounded memory: chunked runs -----------------------------------------------------------

TEST(WorkspaceCap, DeepSeek65536TokensUnder256MiB) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::LayerWeights& weights = cached_weights("deepseek-v3-tp8");
  testkit::CheckOptions options;
  options.num_tokens = 65536;
  options.entry = Entry::kLogits;
  options.seed = 65536;
  options.max_reference_tokens = reference_token_budget(weights.spec);
  options.max_workspace_bytes = 256 * kMiB;
  const testkit::CheckResult result = testkit::check_layer(weights, options);
  expect_close_to_reference(result, "deepseek-v3-tp8 T=65536, workspace cap 256 MiB");
  EXPECT_GT(result.plan.num_chunks, 1);
}

// Bad ids spread over several chunks are all counted; in batch-invariant mode a chunked run gives
// the same bits as an unchunked one; a captured chunked run replays those bits.
TEST(WorkspaceCap, ChunksCountInvalidIdsAndMatchUnchunkedBits) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::LayerWeights& weights = cached_weights("qwen3-30b-a3b");
  MoeSpec spec = weights.spec;
  spec.batch_invariant = true;
  const int k = spec.top_k;
  const testkit::Stream stream;
  const int num_tokens = 1000;
  testkit::LayerInputs inputs =
      testkit::make_layer_inputs(weights, num_tokens, Entry::kTopK, {RoutingMode::kZipf, 1, 16}, stream.get());
  reference::Routing routing = testkit::host_routing(weights, inputs, stream.get());
  const std::vector<int> bad_slots = {0 * k + 0, 150 * k + 3, 500 * k + k - 1, 999 * k + 1};
  for (int slot : bad_slots) routing.ids[slot] = slot % 2 == 0 ? -7 : spec.num_experts + 3;
  testkit::copy_to_device(inputs.topk_ids.get(), routing.ids, stream.get());

  const Rig whole(spec, plan_options(num_tokens));
  const Rig chunked(spec, plan_options(num_tokens, Orientation::kAuto, dispatch::workspace_layout(spec, 100).total));
  ASSERT_EQ(chunked.runner.plan_info(num_tokens).num_chunks, (num_tokens + chunked.runner.chunk_tokens() - 1) /
                                                                  chunked.runner.chunk_tokens());
  ASSERT_GE(chunked.runner.plan_info(num_tokens).num_chunks, 9);
  DeviceBuffer counter(sizeof(int));
  zero_counter_and_read(counter, stream.get(), true);
  const std::vector<std::uint16_t> whole_out = whole.run(weights, inputs, stream.get(), counter.as<int>());
  EXPECT_EQ(zero_counter_and_read(counter, stream.get(), false), 4);
  zero_counter_and_read(counter, stream.get(), true);
  const std::vector<std::uint16_t> chunked_out = chunked.run(weights, inputs, stream.get(), counter.as<int>());
  EXPECT_EQ(zero_counter_and_read(counter, stream.get(), false), 4) << "the counter accumulates across chunks";
  EXPECT_EQ(rows_differing(whole_out, 0, chunked_out, 0, num_tokens, spec.hidden), 0);
  testkit::CheckResult result = testkit::compare_with_reference(
      weights, x_bits(weights, inputs, stream.get()), routing, chunked_out, reference_token_budget(spec), 16);
  result.plan = chunked.runner.plan_info(num_tokens);
  expect_close_to_reference(result, "qwen3-30b-a3b T=1000 chunked, 4 bad ids");

  const RunArgs args = chunked.args(weights, inputs);
  const testkit::GraphExec graph = testkit::GraphExec::capture(
      stream.get(), [&] { testkit::run_layer(chunked.runner, args, inputs, stream.get()); });
  for (int replay = 0; replay < 2; ++replay) {
    testkit::poison_bf16(chunked.out.get(), chunked.out_count(num_tokens), stream.get());
    graph.launch(stream.get());
    stream.synchronize();
    EXPECT_EQ(rows_differing(chunked_out, 0, chunked.output(num_tokens, stream.get()), 0, num_tokens, spec.hidden), 0)
        << "graph replay " << replay << " of a chunked run";
  }
}

// ---- In place: out == x ---------------------------------------------------------------------

TEST(InPlace, OutMayBeX) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::LayerWeights& weights = cached_weights("qwen3-30b-a3b");
  const testkit::Stream stream;
  const int num_tokens = 1000;
  for (std::size_t cap : {std::size_t{0}, dispatch::workspace_layout(weights.spec, 128).total}) {
    testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, num_tokens, Entry::kLogits, {RoutingMode::kUniform, 1, 17}, stream.get());
    const Rig rig(weights.spec, plan_options(num_tokens, Orientation::kAuto, cap));
    const std::vector<std::uint16_t> separate = rig.run(weights, inputs, stream.get());
    RunArgs args = rig.args(weights, inputs);
    args.out = inputs.x.get();
    testkit::run_layer(rig.runner, args, inputs, stream.get());
    stream.synchronize();
    const std::vector<std::uint16_t> in_place = x_bits(weights, inputs, stream.get());
    EXPECT_EQ(rows_differing(separate, 0, in_place, 0, num_tokens, weights.spec.hidden), 0)
        << "in place, " << rig.runner.plan_info(num_tokens).num_chunks << " chunk(s)";
  }
}

// ---- Determinism ------------------------------------------------------------------------------

TEST(Determinism, GraphReplaysAreBitIdenticalToEagerRuns) {
  HMOE_REQUIRE_HOPPER_GPU();
  const struct {
    const char* name;
    int num_tokens;
    Entry entry;
  } cases[] = {{"qwen3-30b-a3b", 64, Entry::kLogits}, {"qwen3-30b-a3b", 1000, Entry::kTopK},
               {"deepseek-v3-tp8", 7, Entry::kLogits}, {"olmoe-1b-7b", 4096, Entry::kLogits}};
  for (const auto& c : cases) {
    const testkit::LayerWeights& weights = cached_weights(c.name);
    const testkit::Stream stream;
    const testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, c.num_tokens, c.entry, {RoutingMode::kZipf, 1, 18}, stream.get());
    const Rig rig(weights.spec, plan_options(c.num_tokens));
    const std::vector<std::uint16_t> eager = rig.run(weights, inputs, stream.get());
    const RunArgs args = rig.args(weights, inputs);
    const testkit::GraphExec graph = testkit::GraphExec::capture(
        stream.get(), [&] { testkit::run_layer(rig.runner, args, inputs, stream.get()); });
    for (int replay = 0; replay < 3; ++replay) {
      testkit::poison_bf16(rig.out.get(), rig.out_count(c.num_tokens), stream.get());
      graph.launch(stream.get());
      stream.synchronize();
      EXPECT_EQ(rows_differing(eager, 0, rig.output(c.num_tokens, stream.get()), 0, c.num_tokens, weights.spec.hidden),
                0)
          << c.name << " T=" << c.num_tokens << " replay " << replay;
    }
    std::cout << "  " << c.name << " T=" << c.num_tokens << ": eager run and 3 graph replays bit-identical\n";
  }
}

// ---- Batch invariance -------------------------------------------------------------------------

// Probe tokens computed alone (T = 1) and inside batches of 7, 64 and 1000 other pool tokens, at
// different positions each time: with MoeSpec::batch_invariant their output bits never change.
TEST(BatchInvariant, TokenBitsDoNotDependOnTheBatch) {
  HMOE_REQUIRE_HOPPER_GPU();
  const int pool_size = 1000;
  const std::vector<int> probes = {0, 1, 2, 499, 998, 999};
  for (const std::string& name : preset_names()) {
    const testkit::LayerWeights& weights = cached_weights(name);
    const int hidden = weights.spec.hidden;
    for (Entry entry : {Entry::kLogits, Entry::kTopK}) {
      const testkit::Stream stream;
      const RoutingMode mode = entry == Entry::kLogits ? RoutingMode::kUniform : RoutingMode::kZipf;
      const testkit::LayerInputs pool_inputs =
          testkit::make_layer_inputs(weights, pool_size, entry, {mode, 1, 19}, stream.get());
      const HostInputs pool = download(weights.spec, pool_inputs, stream.get());
      for (bool invariant : {true, false}) {
        MoeSpec spec = weights.spec;
        spec.batch_invariant = invariant;
        const Rig rig(spec, plan_options(pool_size));
        std::vector<std::uint16_t> alone;   // [probes, H]
        for (int probe : probes) {
          const testkit::LayerInputs one = device_inputs(weights, select_rows(spec, pool, {probe}), entry, stream.get());
          const std::vector<std::uint16_t> out = rig.run(weights, one, stream.get());
          alone.insert(alone.end(), out.begin(), out.end());
        }
        std::mt19937 generator(20);
        int compared = 0, differing = 0;
        for (int batch_size : {7, 64, 1000}) {
          // Fillers: pool tokens other than the probes, shuffled; probes at spread-out positions.
          std::vector<int> rows;
          for (int token = 0; token < pool_size; ++token)
            if (std::find(probes.begin(), probes.end(), token) == probes.end()) rows.push_back(token);
          std::shuffle(rows.begin(), rows.end(), generator);
          rows.resize(batch_size);
          const int placed = std::min<int>(probes.size(), batch_size);
          std::vector<int> positions(batch_size);
          std::iota(positions.begin(), positions.end(), 0);
          std::shuffle(positions.begin(), positions.end(), generator);
          for (int i = 0; i < placed; ++i) rows[positions[i]] = probes[i];
          const testkit::LayerInputs batch = device_inputs(weights, select_rows(spec, pool, rows), entry, stream.get());
          const std::vector<std::uint16_t> out = rig.run(weights, batch, stream.get());
          for (int i = 0; i < placed; ++i) {
            ++compared;
            differing += rows_differing(alone, i, out, positions[i], 1, hidden);
          }
          if (invariant && batch_size == 64) {
            testkit::CheckResult result = testkit::compare_with_reference(
                weights, x_bits(weights, batch, stream.get()), testkit::host_routing(weights, batch, stream.get()),
                out, reference_token_budget(spec), 21);
            result.plan = rig.runner.plan_info(batch_size);
            expect_close_to_reference(result, name + " batch-invariant T=64");
          }
        }
        std::cout << "  " << name << " " << testkit::to_string(entry) << (invariant ? " batch-invariant" : " default")
                  << ": " << differing << " of " << compared << " probe rows differ from the same token alone\n";
        if (invariant) {
          EXPECT_EQ(differing, 0) << name << " " << testkit::to_string(entry);
        }
      }
    }
  }
}

}  // namespace
}  // namespace hmoe::test
