// Accuracy check of one MoE layer run against the float64 CPU reference (DESIGN.md §2): poisoned
// output, every element inspected, reference on all tokens or a stated sample of them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hmoe/hmoe.hpp"
#include "reference/reference.hpp"
#include "testkit/layer_data.hpp"

namespace hmoe::testkit {

// A bf16 NaN: an element still holding it after a run was never written.
inline constexpr std::uint16_t kPoisonBf16 = 0xFFFF;
// ‖out − ref‖ / ‖ref‖ bounds: the bf16 path vs the float64 reference; the FP8 path vs the
// reference that applies the same quantisation (DESIGN.md §2).
inline constexpr double kBf16Tolerance = 1e-2;
inline constexpr double kFp8Tolerance = 2e-2;

struct CheckOptions {
  int num_tokens = 1;
  RoutingMode routing = RoutingMode::kUniform;
  Entry entry = Entry::kLogits;
  Orientation orientation = Orientation::kAuto;
  std::uint64_t seed = 1;
  // Above this many tokens the reference runs on a seeded sample of this many plus the first and
  // last token; unwritten and non-finite elements are still counted over all of them.
  int max_reference_tokens = 256;
  std::size_t max_workspace_bytes = 0;  // PlanOptions::max_workspace_bytes (0 = no cap, no chunks)
  bool batch_invariant = false;         // runs with MoeSpec::batch_invariant set
  bool static_act_scales = false;       // fp8-tensor: static activation scales instead of dynamic ones
  int split_k = 0;                      // PlanOptions::split_k (0: hmoe's rule)
  // PlanOptions::fused_decode: kAuto (`hmoe check`) checks what a default runner plans; the fused
  // layer's tests ask for kOn.
  FusedDecode fused_decode = FusedDecode::kAuto;
  // PlanOptions::force_variant ("<gemm1>+<gemm2>", empty: the dispatcher decides): `hmoe tune`
  // checks the pair it keeps for a bucket.
  std::string force_variant;
};

struct CheckResult {
  double rel_error = 0.0;          // vs the reference of the layer's dtype (FP8: quantisation emulated)
  double tolerance = kBf16Tolerance;
  double rel_error_unquantised = -1.0;   // FP8 only: vs the bf16 layer the weights were quantised from
  int num_tokens = 0;
  int tokens_checked = 0;
  bool sampled = false;           // tokens_checked < num_tokens
  std::size_t unwritten = 0;      // elements still equal to kPoisonBf16
  std::size_t nonfinite = 0;      // other NaN or Inf elements
  bool passed = false;
  PlanInfo plan;
  double reference_seconds = 0.0;  // CPU routing + reference layer, for logging
};

// Generates weights (seeded by options.seed) and checks one run.
CheckResult check_layer(const MoeSpec& spec, const CheckOptions& options);
// Checks one run with already generated weights (which must keep their host copy).
CheckResult check_layer(const LayerWeights& weights, const CheckOptions& options);

// Fills count bf16 elements with kPoisonBf16.
void poison_bf16(void* out, std::size_t count, cudaStream_t stream);

// Compares a whole output [T, H] (bf16 bits, copied back) with the reference for x and routing,
// counting unwritten / non-finite elements over all of it. Fills every field but plan.
CheckResult compare_with_reference(const LayerWeights& weights, const std::vector<std::uint16_t>& x_host,
                                   const reference::Routing& routing, const std::vector<std::uint16_t>& out_host,
                                   int max_reference_tokens, std::uint64_t sample_seed);

}  // namespace hmoe::testkit
