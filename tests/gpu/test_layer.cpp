// Every preset against the float64 reference across token counts, orientations, routing skews and
// both entry points: rel error ≤ 1e-2 and every output element written.
#include <gtest/gtest.h>

#include <cctype>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "testkit/check.hpp"

namespace hmoe::test {
namespace {

using testkit::Entry;
using testkit::RoutingMode;

struct LayerCase {
  std::string preset_name;
  int num_tokens = 0;
  RoutingMode routing = RoutingMode::kUniform;
  Entry entry = Entry::kLogits;
  Orientation orientation = Orientation::kAuto;
};

// Uniform routing sweeps T × orientation for both entries; the skewed modes, which load a few
// experts heavily, run at the sizes where tiles fill up, and extreme in both forced orientations.
std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> cases;
  for (const std::string& name : preset_names()) {
    for (int tokens : {1, 7, 64, 1000}) {
      for (Orientation orientation : {Orientation::kNormal, Orientation::kSwapAB, Orientation::kAuto})
        cases.push_back({name, tokens, RoutingMode::kUniform, Entry::kLogits, orientation});
      cases.push_back({name, tokens, RoutingMode::kUniform, Entry::kTopK, Orientation::kAuto});
    }
    for (RoutingMode routing : {RoutingMode::kZipf, RoutingMode::kExtreme})
      for (Entry entry : {Entry::kLogits, Entry::kTopK})
        for (int tokens : {64, 1000}) cases.push_back({name, tokens, routing, entry, Orientation::kAuto});
    for (Orientation orientation : {Orientation::kNormal, Orientation::kSwapAB})
      cases.push_back({name, 1000, RoutingMode::kExtreme, Entry::kLogits, orientation});
  }
  return cases;
}

// gtest prints the parameter of a failing or listed case with this instead of a byte dump.
void PrintTo(const LayerCase& layer_case, std::ostream* os) {
  *os << layer_case.preset_name << " T=" << layer_case.num_tokens << " " << testkit::to_string(layer_case.routing)
      << " " << testkit::to_string(layer_case.entry) << " " << to_string(layer_case.orientation);
}

std::string case_name(const testing::TestParamInfo<LayerCase>& info) {
  std::string name = info.param.preset_name + "_T" + std::to_string(info.param.num_tokens) + "_" +
                     testkit::to_string(info.param.routing) + "_" + testkit::to_string(info.param.entry) + "_" +
                     to_string(info.param.orientation);
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

class LayerTest : public testing::TestWithParam<LayerCase> {};

TEST_P(LayerTest, MatchesReference) {
  HMOE_REQUIRE_HOPPER_GPU();
  const LayerCase& layer_case = GetParam();
  const testkit::LayerWeights& weights = cached_weights(layer_case.preset_name);
  testkit::CheckOptions options;
  options.num_tokens = layer_case.num_tokens;
  options.routing = layer_case.routing;
  options.entry = layer_case.entry;
  options.orientation = layer_case.orientation;
  options.seed = 100 + layer_case.num_tokens;
  options.max_reference_tokens = reference_token_budget(weights.spec);
  const testkit::CheckResult result = testkit::check_layer(weights, options);
  const std::string summary = "plan " + to_string(result.plan.orientation) + " " +
                              std::to_string(result.plan.weight_tile) + "x" + std::to_string(result.plan.token_tile) +
                              " rel_err " + std::to_string(result.rel_error) + " over " +
                              std::to_string(result.tokens_checked) + "/" + std::to_string(result.num_tokens) +
                              " tokens, unwritten " + std::to_string(result.unwritten) + ", nonfinite " +
                              std::to_string(result.nonfinite);
  std::cout << "  " << summary << "\n";
  EXPECT_EQ(result.unwritten, 0u) << summary;
  EXPECT_EQ(result.nonfinite, 0u) << summary;
  EXPECT_LE(result.rel_error, result.tolerance) << summary;
  if (layer_case.orientation != Orientation::kAuto) {
    EXPECT_EQ(result.plan.orientation, layer_case.orientation) << "a forced orientation must be the one planned";
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, LayerTest, testing::ValuesIn(layer_cases()), case_name);

}  // namespace
}  // namespace hmoe::test
