// Shared by the GPU tests: the skip when no Hopper GPU is present, generated weights cached per
// preset (Mixtral's are 2.8 GB), and how many reference tokens fit a test's time budget.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "testkit/cuda_handles.hpp"
#include "testkit/device.hpp"
#include "testkit/layer_data.hpp"

#define HMOE_REQUIRE_HOPPER_GPU()                                             \
  do {                                                                        \
    std::string hmoe_no_gpu_reason_;                                          \
    if (!::hmoe::testkit::hopper_gpu_available(&hmoe_no_gpu_reason_))        \
      GTEST_SKIP() << "no Hopper GPU: " << hmoe_no_gpu_reason_;               \
  } while (0)

namespace hmoe::test {

inline constexpr std::uint64_t kWeightSeed = 1;

// Weights with host copies, generated once per preset for the whole test binary.
inline const testkit::LayerWeights& cached_weights(const std::string& preset_name) {
  static std::map<std::string, std::unique_ptr<testkit::LayerWeights>> cache;
  std::unique_ptr<testkit::LayerWeights>& entry = cache[preset_name];
  if (!entry) {
    const testkit::Stream stream;
    entry = std::make_unique<testkit::LayerWeights>(
        testkit::make_layer_weights(preset(preset_name), kWeightSeed, /*keep_host_copy=*/true, stream.get()));
  }
  return *entry;
}

// FP8 weights (the preset with this scheme) with host copies, generated once per (preset, scheme,
// static activation scales) for the whole test binary.
inline const testkit::LayerWeights& cached_fp8_weights(const std::string& preset_name, QuantScheme scheme,
                                                       bool static_scales = false) {
  static std::map<std::tuple<std::string, int, bool>, std::unique_ptr<testkit::LayerWeights>> cache;
  std::unique_ptr<testkit::LayerWeights>& entry = cache[{preset_name, static_cast<int>(scheme), static_scales}];
  if (!entry) {
    MoeSpec spec = preset(preset_name);
    spec.weight_dtype = WeightDType::kFP8E4M3;
    spec.scheme = scheme;
    const testkit::Stream stream;
    entry = std::make_unique<testkit::LayerWeights>(
        testkit::make_layer_weights(spec, kWeightSeed, /*keep_host_copy=*/true, stream.get(), static_scales));
  }
  return *entry;
}

// The float64 reference costs 6·k·H·I per token and ran at ~0.25 GFLOP/s per core when measured;
// about 2 GFLOP per case keeps the ~130 cases near a minute on a 16-core host (4 tokens for Mixtral,
// ~20-26 for the small-expert presets) plus the first and last token.
inline int reference_token_budget(const MoeSpec& spec) {
  const double flops_per_token = 6.0 * spec.top_k * spec.hidden * static_cast<double>(spec.intermediate);
  return std::clamp(static_cast<int>(2e9 / flops_per_token), 4, 64);
}

}  // namespace hmoe::test
