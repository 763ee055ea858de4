// The fused decode layer (src/decode: the whole layer in one kernel at T ≤ decode::kMaxTokens, asked
// for with PlanOptions::fused_decode = FusedDecode::kOn):
// every preset and scheme against the reference at T = 1..4 through both entry points and skewed
// routing, odd top-k ids (out of range, repeated within a token) against the reference and the
// unfused kernels, bit-identical reruns, and where the plan says it runs.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "decode/decode_layer.hpp"
#include "gpu_test_support.hpp"
#include "testkit/check.hpp"

namespace hmoe::test {
namespace {

using testkit::Entry;
using testkit::RoutingMode;

struct DecodeCase {
  int num_tokens;
  Entry entry;
  RoutingMode routing;
};

// T = 1..4 from logits, plus every expert shared by all tokens (extreme) and popular experts (zipf)
// from the caller's top-k.
const DecodeCase kCases[] = {{1, Entry::kLogits, RoutingMode::kUniform}, {2, Entry::kLogits, RoutingMode::kUniform},
                             {3, Entry::kLogits, RoutingMode::kUniform}, {4, Entry::kLogits, RoutingMode::kUniform},
                             {4, Entry::kTopK, RoutingMode::kExtreme},   {3, Entry::kTopK, RoutingMode::kZipf}};

void check_cases(const testkit::LayerWeights& weights, const std::string& name) {
  const bool fp8 = weights.fp8();
  for (const DecodeCase& c : kCases) {
    testkit::CheckOptions options;
    options.num_tokens = c.num_tokens;
    options.entry = c.entry;
    options.routing = c.routing;
    options.seed = 700 + c.num_tokens;
    options.static_act_scales = weights.static_act_scales;
    options.fused_decode = FusedDecode::kOn;
    const testkit::CheckResult result = testkit::check_layer(weights, options);
    const std::string what = name + " T=" + std::to_string(c.num_tokens) + " " + testkit::to_string(c.entry) + " " +
                             testkit::to_string(c.routing) + ": " + result.plan.gemm1_kernel + " rel_err " +
                             std::to_string(result.rel_error) + ", unwritten " + std::to_string(result.unwritten) +
                             ", nonfinite " + std::to_string(result.nonfinite);
    std::cout << "  " << what << "\n";
    EXPECT_EQ(result.plan.fused_decode, decode::applies(weights.spec, c.num_tokens)) << what;
    EXPECT_EQ(result.tolerance, fp8 ? testkit::kFp8Tolerance : testkit::kBf16Tolerance) << what;
    EXPECT_EQ(result.unwritten, 0u) << what;
    EXPECT_EQ(result.nonfinite, 0u) << what;
    EXPECT_LE(result.rel_error, result.tolerance) << what;
  }
}

TEST(FusedDecode, EveryPresetBf16MatchesTheReference) {
  HMOE_REQUIRE_HOPPER_GPU();
  for (const std::string& name : preset_names()) {
    ASSERT_TRUE(decode::applies(preset(name), 1)) << name << ": T = 1 should run fused";
    check_cases(cached_weights(name), name + " bf16");
  }
}

TEST(FusedDecode, EveryPresetAndFp8SchemeMatchesTheQuantisedReference) {
  HMOE_REQUIRE_HOPPER_GPU();
  for (const std::string& name : preset_names()) {
    for (QuantScheme scheme : {QuantScheme::kPerTensor, QuantScheme::kPerChannelPerToken, QuantScheme::kBlock128}) {
      if (scheme == QuantScheme::kBlock128 && preset(name).intermediate % 128 != 0) continue;
      check_cases(cached_fp8_weights(name, scheme), name + " " + to_string(scheme));
    }
    check_cases(cached_fp8_weights(name, QuantScheme::kPerTensor, /*static_scales=*/true),
                name + " fp8-tensor(static)");
  }
}

// Ids out of [0, E) and an expert repeated within one token: the fused kernel skips and counts the
// former and computes the latter once per slot, as the unfused kernels do; a rerun gives the same bits.
TEST(FusedDecode, OddIdsMatchTheReferenceAndTheUnfusedKernels) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream;
  for (const std::string& name : {std::string("qwen3-30b-a3b"), std::string("deepseek-v3-tp8")}) {
    const testkit::LayerWeights& weights =
        name == "qwen3-30b-a3b" ? cached_weights(name) : cached_fp8_weights(name, QuantScheme::kBlock128);
    const MoeSpec& spec = weights.spec;
    const int tokens = 3, k = spec.top_k;
    testkit::LayerInputs inputs = testkit::make_layer_inputs(weights, tokens, Entry::kTopK, {}, stream.get());
    std::vector<std::int32_t> ids = testkit::copy_to_host<std::int32_t>(inputs.topk_ids.get(), tokens * k, stream.get());
    ids[0] = -1;                     // token 0: one slot out of range below ...
    ids[1] = spec.num_experts;       // ... and one above
    ids[k + 1] = ids[k];             // token 1: the same expert twice
    for (int s = 0; s < k; ++s) ids[2 * k + s] = 1000000 + s;   // token 2: nothing valid (output zero)
    testkit::copy_to_device(inputs.topk_ids.get(), ids, stream.get());

    const auto run = [&](Orientation orientation, std::vector<std::uint16_t>& out_host, int& invalid) {
      PlanOptions options;
      options.max_tokens = tokens;
      options.orientation = orientation;
      options.fused_decode = FusedDecode::kOn;   // the forced orientation runs the unfused kernels
      const MoeRunner runner(spec, options);
      EXPECT_EQ(runner.plan_info(tokens).fused_decode, orientation == Orientation::kAuto) << name;
      testkit::DeviceBuffer out(static_cast<std::size_t>(tokens) * spec.hidden * 2), workspace(runner.workspace_bytes()),
          counter(4);
      testkit::poison_bf16(out.get(), static_cast<std::size_t>(tokens) * spec.hidden, stream.get());
      HMOE_CUDA_CHECK(cudaMemsetAsync(counter.get(), 0, 4, stream.get()));
      RunArgs args = testkit::run_args(weights, inputs, out.get());
      args.workspace = workspace.get();
      args.workspace_size = runner.workspace_bytes();
      args.invalid_id_count = counter.as<int>();
      testkit::run_layer(runner, args, inputs, stream.get());
      out_host = testkit::copy_to_host<std::uint16_t>(out.get(), static_cast<std::size_t>(tokens) * spec.hidden, stream.get());
      invalid = testkit::copy_to_host<int>(counter.get(), 1, stream.get())[0];
    };
    std::vector<std::uint16_t> fused, again, unfused;
    int fused_invalid = 0, again_invalid = 0, unfused_invalid = 0;
    run(Orientation::kAuto, fused, fused_invalid);
    run(Orientation::kAuto, again, again_invalid);
    run(Orientation::kSwapAB, unfused, unfused_invalid);
    EXPECT_EQ(fused_invalid, 2 + k) << name;
    EXPECT_EQ(unfused_invalid, fused_invalid) << name;
    EXPECT_TRUE(fused == again) << name << ": a rerun changed bits";
    for (int h = 0; h < spec.hidden; ++h)
      ASSERT_EQ(fused[2 * spec.hidden + h], 0u) << name << ": token 2 has no valid slot, its output must be +0";

    const std::vector<std::uint16_t> x_host =
        testkit::copy_to_host<std::uint16_t>(inputs.x.get(), static_cast<std::size_t>(tokens) * spec.hidden, stream.get());
    const reference::Routing routing = testkit::host_routing(weights, inputs, stream.get());
    for (const auto* out : {&fused, &unfused}) {
      const testkit::CheckResult result =
          testkit::compare_with_reference(weights, x_host, routing, *out, tokens, /*sample_seed=*/1);
      std::cout << "  " << name << (out == &fused ? " fused" : " unfused") << ": rel_err " << result.rel_error << "\n";
      EXPECT_EQ(result.unwritten, 0u) << name;
      EXPECT_LE(result.rel_error, result.tolerance) << name;
    }
  }
}

}  // namespace
}  // namespace hmoe::test
