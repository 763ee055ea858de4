// Shared by the reliability GPU tests (issue 7): a runner with its workspace and output, host
// copies of layer inputs that can be re-assembled row by row into new batches, and the float64
// reference on an explicit list of tokens.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "reference/reference.hpp"
#include "testkit/check.hpp"

namespace hmoe::test {

// PlanOptions with the fields these tests vary (the others at their defaults).
inline PlanOptions plan_options(int max_tokens, Orientation orientation = Orientation::kAuto,
                                std::size_t max_workspace_bytes = 0) {
  PlanOptions options;
  options.max_tokens = max_tokens;
  options.orientation = orientation;
  options.max_workspace_bytes = max_workspace_bytes;
  return options;
}

// A runner planned with `options`, its workspace, and an output of max_tokens rows.
struct Rig {
  Rig(const MoeSpec& spec, const PlanOptions& options)
      : runner(spec, options),
        workspace(runner.workspace_bytes()),
        hidden(spec.hidden),
        out(static_cast<std::size_t>(options.max_tokens) * spec.hidden * sizeof(std::uint16_t)) {}

  RunArgs args(const testkit::LayerWeights& weights, const testkit::LayerInputs& inputs,
               int* invalid_id_count = nullptr) const {
    RunArgs run_args = testkit::run_args(weights, inputs, out.get());
    run_args.workspace = workspace.get();
    run_args.workspace_size = workspace.bytes();
    run_args.invalid_id_count = invalid_id_count;
    return run_args;
  }
  std::size_t out_count(int num_tokens) const { return static_cast<std::size_t>(num_tokens) * hidden; }

  // Poisons the output, runs the inputs' entry point, and returns the [T, H] output bits.
  std::vector<std::uint16_t> run(const testkit::LayerWeights& weights, const testkit::LayerInputs& inputs,
                                 cudaStream_t stream, int* invalid_id_count = nullptr) const {
    testkit::poison_bf16(out.get(), out_count(inputs.num_tokens), stream);
    testkit::run_layer(runner, args(weights, inputs, invalid_id_count), inputs, stream);
    HMOE_CUDA_CHECK(cudaGetLastError());
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return output(inputs.num_tokens, stream);
  }
  std::vector<std::uint16_t> output(int num_tokens, cudaStream_t stream) const {
    return testkit::copy_to_host<std::uint16_t>(out.get(), out_count(num_tokens), stream);
  }

  MoeRunner runner;
  testkit::DeviceBuffer workspace;
  int hidden;
  testkit::DeviceBuffer out;
};

// Raw host bytes of one input set, row-major by token, in the device layout.
struct HostInputs {
  int num_tokens = 0;
  std::vector<std::uint8_t> x;        // [T, H] bf16
  std::vector<std::uint8_t> logits;   // [T, E] logits dtype (logits entry)
  std::vector<std::uint8_t> ids;      // [T, k] int32 (topk entry)
  std::vector<std::uint8_t> weights;  // [T, k] fp32 (topk entry)
};

struct RowBytes {
  std::size_t x, logits, slots;
};

inline RowBytes row_bytes(const MoeSpec& spec) {
  const std::size_t logit = spec.routing.logits_dtype == LogitsDType::kBFloat16 ? 2 : 4;
  return {static_cast<std::size_t>(spec.hidden) * 2, spec.num_experts * logit, static_cast<std::size_t>(spec.top_k) * 4};
}

inline HostInputs download(const MoeSpec& spec, const testkit::LayerInputs& inputs, cudaStream_t stream) {
  const RowBytes row = row_bytes(spec);
  const std::size_t tokens = inputs.num_tokens;
  HostInputs host;
  host.num_tokens = inputs.num_tokens;
  host.x = testkit::copy_to_host<std::uint8_t>(inputs.x.get(), tokens * row.x, stream);
  if (inputs.entry == testkit::Entry::kLogits) {
    host.logits = testkit::copy_to_host<std::uint8_t>(inputs.router_logits.get(), tokens * row.logits, stream);
  } else {
    host.ids = testkit::copy_to_host<std::uint8_t>(inputs.topk_ids.get(), tokens * row.slots, stream);
    host.weights = testkit::copy_to_host<std::uint8_t>(inputs.topk_weights.get(), tokens * row.slots, stream);
  }
  return host;
}

// Overwrites inputs (allocated for host.num_tokens tokens) with host's bytes.
inline void upload(testkit::LayerInputs& inputs, const HostInputs& host, cudaStream_t stream) {
  testkit::copy_to_device(inputs.x.get(), host.x, stream);
  if (inputs.entry == testkit::Entry::kLogits) {
    testkit::copy_to_device(inputs.router_logits.get(), host.logits, stream);
  } else {
    testkit::copy_to_device(inputs.topk_ids.get(), host.ids, stream);
    testkit::copy_to_device(inputs.topk_weights.get(), host.weights, stream);
  }
}

// The batch whose token i is pool token rows[i].
inline HostInputs select_rows(const MoeSpec& spec, const HostInputs& pool, const std::vector<int>& rows) {
  const RowBytes row = row_bytes(spec);
  HostInputs batch;
  batch.num_tokens = static_cast<int>(rows.size());
  auto gather = [&rows](const std::vector<std::uint8_t>& source, std::size_t bytes, std::vector<std::uint8_t>& to) {
    if (source.empty()) return;
    to.resize(rows.size() * bytes);
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::memcpy(to.data() + i * bytes, source.data() + static_cast<std::size_t>(rows[i]) * bytes, bytes);
  };
  gather(pool.x, row.x, batch.x);
  gather(pool.logits, row.logits, batch.logits);
  gather(pool.ids, row.slots, batch.ids);
  gather(pool.weights, row.slots, batch.weights);
  return batch;
}

// Device inputs holding exactly host's bytes.
inline testkit::LayerInputs device_inputs(const testkit::LayerWeights& weights, const HostInputs& host,
                                          testkit::Entry entry, cudaStream_t stream) {
  testkit::LayerInputs inputs = testkit::make_layer_inputs(weights, host.num_tokens, entry, {}, stream);
  upload(inputs, host, stream);
  return inputs;
}

inline std::vector<std::uint16_t> x_bits(const testkit::LayerWeights& weights, const testkit::LayerInputs& inputs,
                                         cudaStream_t stream) {
  return testkit::copy_to_host<std::uint16_t>(inputs.x.get(),
                                              static_cast<std::size_t>(inputs.num_tokens) * weights.spec.hidden, stream);
}

// ‖out − ref‖ / ‖ref‖ over the listed tokens only (the others may hold documented NaNs).
inline double rel_error_on(const testkit::LayerWeights& weights, const std::vector<std::uint16_t>& x_host,
                           const reference::Routing& routing, const std::vector<std::uint16_t>& out_host,
                           const std::vector<int>& tokens) {
  const reference::Bf16Layer layer{x_host.data(), weights.w13_host.data(), weights.w2_host.data()};
  const std::vector<double> expected = reference::moe_layer(weights.spec, layer, routing, tokens);
  std::vector<double> actual;
  const int hidden = weights.spec.hidden;
  for (int token : tokens)
    for (int column = 0; column < hidden; ++column)
      actual.push_back(reference::bf16_to_float(out_host[static_cast<std::size_t>(token) * hidden + column]));
  return reference::relative_error(expected.data(), actual.data(), expected.size());
}

// Output rows equal bit for bit; returns how many rows of `tokens` differ.
inline int rows_differing(const std::vector<std::uint16_t>& a, int a_token_base, const std::vector<std::uint16_t>& b,
                          int b_token_base, int count, int hidden) {
  int differing = 0;
  for (int i = 0; i < count; ++i) {
    const std::size_t a_row = static_cast<std::size_t>(a_token_base + i) * hidden;
    const std::size_t b_row = static_cast<std::size_t>(b_token_base + i) * hidden;
    if (std::memcmp(a.data() + a_row, b.data() + b_row, hidden * sizeof(std::uint16_t)) != 0) ++differing;
  }
  return differing;
}

inline void expect_close_to_reference(const testkit::CheckResult& result, const std::string& what) {
  std::cout << "  " << what << ": plan " << to_string(result.plan.orientation) << " " << result.plan.weight_tile << "x"
            << result.plan.token_tile << " in " << result.plan.num_chunks << " chunk(s), rel_err " << result.rel_error
            << " over " << result.tokens_checked << "/" << result.num_tokens << " tokens, unwritten "
            << result.unwritten << ", nonfinite " << result.nonfinite << "\n";
  EXPECT_EQ(result.unwritten, 0u) << what;
  EXPECT_EQ(result.nonfinite, 0u) << what;
  EXPECT_LE(result.rel_error, result.tolerance) << what;
}

}  // namespace hmoe::test
