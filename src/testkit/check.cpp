// check_layer: generate, prepare, poison, run, copy back, and judge against the CPU reference.
#include "testkit/check.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "testkit/cuda_handles.hpp"

namespace hmoe::testkit {
namespace {

// The rows the reference computes: all of them, or a seeded sample plus the first and the last.
std::vector<int> tokens_to_check(int num_tokens, int max_reference_tokens, std::uint64_t seed) {
  std::vector<int> tokens(num_tokens);
  std::iota(tokens.begin(), tokens.end(), 0);
  const int sample_size = std::max(max_reference_tokens, 0);
  // With at most sample + 2 tokens the sample would be all of them anyway.
  if (num_tokens <= sample_size + 2) return tokens;
  std::mt19937_64 generator(seed);
  std::shuffle(tokens.begin() + 1, tokens.end() - 1, generator);
  tokens.resize(1 + sample_size);
  tokens.push_back(num_tokens - 1);
  std::sort(tokens.begin(), tokens.end());
  return tokens;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void poison_bf16(void* out, std::size_t count, cudaStream_t stream) {
  static_assert(kPoisonBf16 == 0xFFFF, "cudaMemsetAsync writes one byte value everywhere");
  HMOE_CUDA_CHECK(cudaMemsetAsync(out, 0xFF, count * sizeof(std::uint16_t), stream));
}

CheckResult compare_with_reference(const LayerWeights& weights, const std::vector<std::uint16_t>& x_host,
                                   const reference::Routing& routing, const std::vector<std::uint16_t>& out_host,
                                   int max_reference_tokens, std::uint64_t sample_seed) {
  if (!weights.has_host_copy()) throw Error("hmoe testkit: compare_with_reference needs weights with a host copy");
  const MoeSpec& spec = weights.spec;
  const int hidden = spec.hidden;
  CheckResult result;
  result.num_tokens = routing.num_tokens;
  for (std::uint16_t bits : out_host) {
    if (bits == kPoisonBf16) {
      ++result.unwritten;
    } else if (!std::isfinite(reference::bf16_to_float(bits))) {
      ++result.nonfinite;
    }
  }

  const std::vector<int> tokens = tokens_to_check(routing.num_tokens, max_reference_tokens, sample_seed);
  result.tokens_checked = static_cast<int>(tokens.size());
  result.sampled = result.tokens_checked < result.num_tokens;
  const auto start = std::chrono::steady_clock::now();
  MoeSpec bf16_spec = spec;
  bf16_spec.weight_dtype = WeightDType::kBF16;
  bf16_spec.scheme = QuantScheme::kNone;
  bf16_spec.ue8m0_scales = false;
  const reference::Bf16Layer bf16_layer{x_host.data(), weights.w13_host.data(), weights.w2_host.data()};
  const std::vector<double> unquantised = reference::moe_layer(bf16_spec, bf16_layer, routing, tokens);
  std::vector<double> expected;
  if (weights.fp8()) {
    const reference::Fp8Layer layer{x_host.data(), &weights.w13_fp8_host, &weights.w2_fp8_host, weights.fp8_options()};
    expected = reference::moe_layer(spec, layer, routing, tokens);
    result.tolerance = kFp8Tolerance;
  } else {
    expected = unquantised;
  }
  result.reference_seconds = seconds_since(start);

  std::vector<double> actual;
  actual.reserve(expected.size());
  for (int token : tokens) {
    const std::uint16_t* row = out_host.data() + static_cast<std::size_t>(token) * hidden;
    for (int column = 0; column < hidden; ++column) actual.push_back(reference::bf16_to_float(row[column]));
  }
  result.rel_error = reference::relative_error(expected.data(), actual.data(), expected.size());
  if (weights.fp8())
    result.rel_error_unquantised = reference::relative_error(unquantised.data(), actual.data(), actual.size());
  result.passed = result.rel_error <= result.tolerance && result.unwritten == 0 && result.nonfinite == 0;
  return result;
}

CheckResult check_layer(const MoeSpec& spec, const CheckOptions& options) {
  Stream stream;
  const LayerWeights weights =
      make_layer_weights(spec, options.seed, /*keep_host_copy=*/true, stream.get(), options.static_act_scales);
  return check_layer(weights, options);
}

CheckResult check_layer(const LayerWeights& weights, const CheckOptions& options) {
  if (options.num_tokens < 1) throw Error("hmoe testkit: check_layer needs num_tokens >= 1");
  const MoeSpec& spec = weights.spec;
  Stream stream;
  const RoutingDraw draw{options.routing, options.seed, options.seed + 1};
  const LayerInputs inputs = make_layer_inputs(weights, options.num_tokens, options.entry, draw, stream.get());

  PlanOptions plan_options;
  plan_options.max_tokens = options.num_tokens;
  plan_options.orientation = options.orientation;
  plan_options.max_workspace_bytes = options.max_workspace_bytes;
  plan_options.split_k = options.split_k;
  plan_options.fused_decode = options.fused_decode;
  plan_options.force_variant = options.force_variant;
  MoeSpec run_spec = spec;
  run_spec.batch_invariant = spec.batch_invariant || options.batch_invariant;
  const MoeRunner runner(run_spec, plan_options);
  DeviceBuffer workspace(runner.workspace_bytes());
  const std::size_t out_count = static_cast<std::size_t>(options.num_tokens) * spec.hidden;
  DeviceBuffer out(out_count * sizeof(std::uint16_t));
  poison_bf16(out.get(), out_count, stream.get());

  RunArgs args = run_args(weights, inputs, out.get());
  args.workspace = workspace.get();
  args.workspace_size = workspace.bytes();
  run_layer(runner, args, inputs, stream.get());
  HMOE_CUDA_CHECK(cudaGetLastError());
  stream.synchronize();

  const std::vector<std::uint16_t> out_host = copy_to_host<std::uint16_t>(out.get(), out_count, stream.get());
  const std::vector<std::uint16_t> x_host = copy_to_host<std::uint16_t>(inputs.x.get(), out_count, stream.get());
  const auto routing_start = std::chrono::steady_clock::now();
  const reference::Routing routing = host_routing(weights, inputs, stream.get());
  const double routing_seconds = seconds_since(routing_start);

  CheckResult result = compare_with_reference(weights, x_host, routing, out_host, options.max_reference_tokens,
                                              options.seed);
  result.reference_seconds += routing_seconds;
  result.plan = runner.plan_info(options.num_tokens);
  return result;
}

}  // namespace hmoe::testkit
