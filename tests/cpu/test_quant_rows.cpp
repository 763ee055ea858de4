// quant::launch_quantize_rows refuses, on the host and before it enqueues anything, the two walks whose
// kernel would read past what it was given: a per-row walk without its device row count, and
// token-ordered values without the per-token walk they belong to. No GPU is needed: nothing is launched.
#include <gtest/gtest.h>

#include <string>

#include "hmoe/hmoe.hpp"
#include "quant/activations.hpp"

namespace hmoe::quant {
namespace {

MoeSpec channel_spec() {
  MoeSpec spec;
  spec.num_experts = 4;
  spec.top_k = 2;
  spec.hidden = 256;
  spec.intermediate = 128;
  spec.weight_dtype = WeightDType::kFP8E4M3;
  spec.scheme = QuantScheme::kPerChannelPerToken;
  return spec;
}

std::string refusal(const MoeSpec& spec, const ActivationRows& rows) {
  try {
    launch_quantize_rows(spec, rows, nullptr, nullptr, nullptr, nullptr);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(QuantRows, PerRowWalkWithoutItsRowCountIsRefused) {
  ActivationRows rows;
  rows.max_rows = 16;
  rows.cols = 256;
  EXPECT_NE(refusal(channel_spec(), rows).find("ActivationRows::num_rows"), std::string::npos);
}

TEST(QuantRows, TokenOrderedValuesWithoutThePerTokenWalkAreRefused) {
  const int row_count = 16;
  ActivationRows rows;
  rows.num_rows = &row_count;   // never read: the refusal comes first
  rows.max_rows = 16;
  rows.cols = 256;
  rows.values_by_token = true;
  EXPECT_NE(refusal(channel_spec(), rows).find("values_by_token"), std::string::npos);
}

}  // namespace
}  // namespace hmoe::quant
