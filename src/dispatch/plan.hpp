// The dispatcher's choices for one run: orientation, token tile and the two GEMM variants, and
// the workspace layout every run of a runner shares.
#pragma once

#include <cstddef>
#include <string_view>

#include "gemm/variants.hpp"
#include "hmoe/hmoe.hpp"

namespace hmoe::dispatch {

struct Plan {
  bool swap_ab = false;
  int token_tile = 0;
  const gemm::GemmVariant* gemm1 = nullptr;
  const gemm::GemmVariant* gemm2 = nullptr;
  // Who chose it: "analytic", "tuned:<file>", "forced" or "batch-invariant" (PlanInfo::source).
  // Points at a literal or into the runner's tuned table, which outlives every plan.
  std::string_view source = "analytic";
};

// A forced variant or tuned table a runner found at plan time (dispatch/tuned_table.hpp).
struct PlanOverrides;

// overrides, when given, decide first (see overridden_plan); else the analytic rule.
Plan choose_plan(const MoeSpec& spec, int num_tokens, Orientation orientation,
                 const PlanOverrides* overrides = nullptr);

// The one plan of batch-invariant mode (MoeSpec::batch_invariant), whatever T: normal orientation,
// 64-token × 128-weight-row tiles (of spec's dtype).
Plan batch_invariant_plan(const MoeSpec& spec);

// The plan of one run or chunk: batch_invariant_plan() when spec.batch_invariant, else choose_plan.
Plan plan_for(const MoeSpec& spec, int num_tokens, Orientation orientation,
              const PlanOverrides* overrides = nullptr);

// HMOE_FUSED_DECODE in the environment, read once per process: -1 unset, 0 for "0", else 1. Set,
// it acts as FusedDecode::kOff / kOn for every runner (A/B timing).
int fused_decode_environment();

// Who has a run (chunk) of T tokens run as the fused decode layer (docs/DISPATCH.md, "Fused decode
// layer"), as PlanInfo::source reports it: "environment" (HMOE_FUSED_DECODE=1), "option"
// (FusedDecode::kOn) or, under kAuto, the tuned table's source when its bucket for T says "fused";
// empty when the unfused kernels run: where decode::applies does not hold, and always for runners
// that force an orientation or a variant, skip stages, set split_k or are batch-invariant (they ask
// for the kernels they name). environment: fused_decode_environment() or, in tests, -1, 0 or 1.
std::string_view fused_decode_source(const MoeSpec& spec, const PlanOptions& options, const PlanOverrides* overrides,
                                     int num_tokens, int environment);

// Whether some run (chunk) of at most chunk_tokens tokens is the fused decode layer: then the plan
// time prepares and warms up its kernel (one kernel per scheme, T is an argument).
bool fuses_at_any_decode_size(const MoeSpec& spec, const PlanOptions& options, const PlanOverrides* overrides,
                              int chunk_tokens, int environment);

// Byte offsets into the caller's workspace, each region 256-byte aligned.
struct WorkspaceLayout {
  std::size_t topk_ids = 0;       // [T·k] int32 (routing output when hmoe routes)
  std::size_t topk_weights = 0;   // [T·k] fp32
  std::size_t expert_counts = 0;  // [E]
  std::size_t expert_cursor = 0;  // [E]
  std::size_t expert_offsets = 0; // [E + 1]
  std::size_t num_tiles = 0;      // [1]
  std::size_t tiles = 0;          // [max_token_tiles] TokenTile
  std::size_t slot_rows = 0;      // [T·k] int32
  std::size_t row_weights = 0;    // [T·k] fp32
  std::size_t sorted_tokens = 0;  // [T·k] int32: token of each expert-sorted row
  std::size_t sorted_rows = 0;    // [T·k, H] bf16 (FP8: e4m3): gathered x, then (reused) GEMM2's bf16 output
  std::size_t intermediate = 0;   // [T·k, I] bf16: SwiGLU output
  // FP8 layers only (0 otherwise): the scales of the quantised x rows, the re-quantised SwiGLU
  // output and its scales. Per-tensor schemes keep [scale, amax] in their two floats.
  std::size_t x_scales = 0;
  std::size_t intermediate_fp8 = 0;       // [T·k, I] e4m3
  std::size_t intermediate_scales = 0;
  // The split along K (choose_splits), not in batch-invariant layers: fp32 partial sums
  // [gemm::kSplitPartialFloats] and per-output-tile arrival counters [gemm::kSplitCounters] (zeroed
  // by the permute stage, left zero by the GEMMs).
  std::size_t split_partials = 0;
  std::size_t split_counters = 0;
  std::size_t total = 0;
};

// Up to this many (token, slot) pairs GEMM1 gathers x rows itself with per-row TMA boxes: that
// saves the gather launch (~4 µs at T = 1), while the per-row requests still cost less than it.
inline constexpr long long kMaxInGemmGatherRows = 512;

// Smallest token tile any plan uses; the tile list is sized for it.
inline constexpr int kMinTokenTile = 8;

WorkspaceLayout workspace_layout(const MoeSpec& spec, int max_tokens);

// How many ways one GEMM launch of `variant` splits K (1: none). output_tiles: the launch's upper
// bound of (token tile × weight tile) items; k: its K; requested: PlanOptions::split_k (0 = this
// rule, n ≥ 1 = n ways, capped by what the variant, K and the workspace allow).
int choose_splits(const gemm::GemmVariant& variant, long long output_tiles, int k, int num_sms, int requested);

// Tokens of the plan-time warm-up (MoeRunner::warm_up) on its small copy `small` of the layer:
// token t's slot s goes to expert (t·k + s) mod E, and the count is the fewest for which every
// expert gets whole token tiles enough that the GEMM with fewer weight tiles (weight_tile rows of
// `small.hidden`) has at least want_tiles work items; at most `most`, at least 1.
int warm_up_tokens(const MoeSpec& small, int token_tile, int weight_tile, long long want_tiles, int most);

// Tokens per chunk under a workspace cap: max_tokens when its layout fits (or the cap is 0), else
// the largest count whose layout fits. Throws hmoe::Error naming max_workspace_bytes when not
// even one token fits.
int chunk_tokens(const MoeSpec& spec, int max_tokens, std::size_t max_workspace_bytes);

}  // namespace hmoe::dispatch
