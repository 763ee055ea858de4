// Tests of the model presets (DESIGN.md §3) and of MoeSpec validation: every rejection names the
// field and its value, so a caller can tell what to fix.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "hmoe/hmoe.hpp"

namespace hmoe {
namespace {

struct ExpectedPreset {
  const char* name;
  int experts, top_k, hidden, intermediate;
  RoutingFunction function;
  bool renormalize;
};

TEST(Presets, MatchDesignTable) {
  const ExpectedPreset table[] = {
      {"mixtral-8x7b", 8, 2, 4096, 14336, RoutingFunction::kSoftmaxTopK, true},
      {"qwen3-30b-a3b", 128, 8, 2048, 768, RoutingFunction::kSoftmaxTopK, true},
      {"qwen3-235b-a22b-tp4", 128, 8, 4096, 384, RoutingFunction::kSoftmaxTopK, true},
      {"deepseek-v3-tp8", 256, 8, 7168, 256, RoutingFunction::kGroupedSigmoidTopK, false},
      {"olmoe-1b-7b", 64, 8, 2048, 1024, RoutingFunction::kSoftmaxTopK, false},
  };
  for (const ExpectedPreset& expected : table) {
    const MoeSpec spec = preset(expected.name);
    EXPECT_EQ(spec.num_experts, expected.experts) << expected.name;
    EXPECT_EQ(spec.top_k, expected.top_k) << expected.name;
    EXPECT_EQ(spec.hidden, expected.hidden) << expected.name;
    EXPECT_EQ(spec.intermediate, expected.intermediate) << expected.name;
    EXPECT_EQ(spec.routing.function, expected.function) << expected.name;
    if (expected.function == RoutingFunction::kSoftmaxTopK) {
      EXPECT_EQ(spec.routing.renormalize, expected.renormalize) << expected.name;
    }
    EXPECT_EQ(spec.weight_dtype, WeightDType::kBF16) << expected.name;
    EXPECT_EQ(spec.scheme, QuantScheme::kNone) << expected.name;
    EXPECT_NO_THROW(validate(spec)) << expected.name;
  }
  const MoeSpec deepseek = preset("deepseek-v3-tp8");
  EXPECT_EQ(deepseek.routing.num_groups, 8);
  EXPECT_EQ(deepseek.routing.topk_groups, 4);
  EXPECT_FLOAT_EQ(deepseek.routing.routed_scaling_factor, 2.5f);
}

TEST(Presets, NamesListEveryPresetOnce) {
  const std::vector<std::string> names = preset_names();
  EXPECT_EQ(names, (std::vector<std::string>{"mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b-tp4",
                                             "deepseek-v3-tp8", "olmoe-1b-7b"}));
  for (const std::string& name : names) EXPECT_NO_THROW(preset(name)) << name;
}

TEST(Presets, UnknownNameThrowsNamingIt) {
  try {
    preset("mixtral-8x22b");
    FAIL() << "expected hmoe::Error";
  } catch (const Error& error) {
    std::printf("message: %s\n", error.what());
    EXPECT_NE(std::string(error.what()).find("mixtral-8x22b"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("qwen3-30b-a3b"), std::string::npos) << "lists the known names";
  }
}

// Applies change to a valid spec and expects validate() to reject it with a message holding text.
void expect_rejected(const MoeSpec& base, const std::function<void(MoeSpec&)>& change, const std::string& text) {
  MoeSpec spec = base;
  change(spec);
  try {
    validate(spec);
    ADD_FAILURE() << "validate accepted a spec that should fail with '" << text << "'";
  } catch (const Error& error) {
    std::printf("rejected: %s\n", error.what());
    EXPECT_NE(std::string(error.what()).find(text), std::string::npos)
        << "message '" << error.what() << "' lacks '" << text << "'";
  }
}

TEST(Validate, RejectsOutOfRangeShapes) {
  const MoeSpec qwen = preset("qwen3-30b-a3b");
  expect_rejected(qwen, [](MoeSpec& s) { s.num_experts = 0; }, "num_experts = 0");
  expect_rejected(qwen, [](MoeSpec& s) { s.num_experts = kMaxExperts + 1; }, "num_experts = 1025");
  expect_rejected(qwen, [](MoeSpec& s) { s.top_k = 0; }, "top_k = 0");
  expect_rejected(qwen, [](MoeSpec& s) { s.top_k = 129; }, "top_k = 129");
  expect_rejected(qwen, [](MoeSpec& s) { s.top_k = kMaxTopK + 1; }, "top_k = 33");
  expect_rejected(qwen, [](MoeSpec& s) { s.hidden = 100; }, "hidden = 100");
  expect_rejected(qwen, [](MoeSpec& s) { s.hidden = 0; }, "hidden = 0");
  expect_rejected(qwen, [](MoeSpec& s) { s.intermediate = 32; }, "intermediate = 32");
  expect_rejected(qwen, [](MoeSpec& s) { s.intermediate = 800; }, "intermediate = 800");
}

TEST(Validate, AcceptsBoundaryShapes) {
  MoeSpec spec = preset("mixtral-8x7b");
  spec.top_k = spec.num_experts;
  spec.hidden = kDimAlignment;
  spec.intermediate = kDimAlignment;
  EXPECT_NO_THROW(validate(spec));
}

TEST(Validate, RejectsSchemeDtypeMismatch) {
  const MoeSpec qwen = preset("qwen3-30b-a3b");
  expect_rejected(qwen, [](MoeSpec& s) { s.scheme = QuantScheme::kBlock128; }, "scheme");
  expect_rejected(qwen, [](MoeSpec& s) { s.weight_dtype = WeightDType::kFP8E4M3; }, "scheme");
}

TEST(Validate, RejectsBadGroupedRouting) {
  const MoeSpec deepseek = preset("deepseek-v3-tp8");
  expect_rejected(deepseek, [](MoeSpec& s) { s.routing.num_groups = 3; }, "routing.num_groups = 3");
  expect_rejected(deepseek, [](MoeSpec& s) { s.routing.num_groups = 0; }, "routing.num_groups = 0");
  expect_rejected(deepseek, [](MoeSpec& s) { s.routing.num_groups = 256; }, "routing.num_groups = 256");
  expect_rejected(deepseek, [](MoeSpec& s) {
    s.num_experts = 16;          // one expert per group leaves no top-2 to sum
    s.routing.num_groups = 16;
  }, "at least 2 experts per group");
  expect_rejected(deepseek, [](MoeSpec& s) { s.routing.topk_groups = 9; }, "routing.topk_groups = 9");
  expect_rejected(deepseek, [](MoeSpec& s) { s.routing.topk_groups = 0; }, "routing.topk_groups = 0");
  expect_rejected(deepseek, [](MoeSpec& s) {
    s.routing.num_groups = 16;   // 16 experts per group, one group kept: top-17 cannot fit
    s.routing.topk_groups = 1;
    s.top_k = 17;
  }, "top_k = 17");
  expect_rejected(deepseek, [](MoeSpec& s) { s.routing.routed_scaling_factor = 0.0f; },
                  "routed_scaling_factor");
}

TEST(ToString, ShortNames) {
  EXPECT_EQ(to_string(WeightDType::kBF16), "bf16");
  EXPECT_EQ(to_string(QuantScheme::kBlock128), "fp8-block");
  EXPECT_EQ(to_string(QuantScheme::kPerTensor), "fp8-tensor");
  EXPECT_EQ(to_string(QuantScheme::kPerChannelPerToken), "fp8-channel");
  EXPECT_EQ(to_string(RoutingFunction::kGroupedSigmoidTopK), "grouped");
  EXPECT_EQ(to_string(Orientation::kSwapAB), "swap");
}

}  // namespace
}  // namespace hmoe
