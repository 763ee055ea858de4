// Orientation and tile choice (an analytic rule until tuned tables exist) and the workspace layout.
#include "dispatch/plan.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "decode/decode_layer.hpp"
#include "dispatch/tuned_table.hpp"
#include "permute/work_list.hpp"

namespace hmoe::dispatch {
namespace {

int next_power_of_two(double value) {
  int power = 1;
  while (power < value) power *= 2;
  return power;
}

}  // namespace

Plan choose_plan(const MoeSpec& spec, int num_tokens, Orientation orientation, const PlanOverrides* overrides) {
  // ---- A forced variant or the tuned table for this shape and device decides first
  // (dispatch/tuned_table.hpp; docs/DISPATCH.md). Their variants were validated when loaded.
  if (overrides != nullptr) {
    if (const std::optional<Plan> plan = overridden_plan(*overrides, num_tokens, orientation)) return *plan;
  }
  // ---- The analytic rule.
  const double tokens_per_expert = static_cast<double>(num_tokens) * spec.top_k / spec.num_experts;
  Plan plan;
  const gemm::QuantKind quant = gemm::quant_kind(spec);
  const bool fp8 = quant != gemm::QuantKind::kNone;
  // Swap-AB up to 16 tokens per expert, normal orientation above, token tiles sized for twice the
  // tokens per expert, bf16 and FP8 alike: what `hmoe tune` picked on H200 for all five presets
  // (tuned tables of 2026-12-04). At 32 and 64 tokens per expert every bf16 table runs the normal
  // 64×128 and 128×256 tiles, 1.17–1.41× faster than the Swap-AB tiles the earlier bf16 rule (Swap-AB
  // to 64, tiles of one times the tokens) ran; at 16 every table runs 32-token Swap-AB tiles, 1.24–1.30×
  // faster than its 16-token ones (docs/DISPATCH.md, "The analytic rule"). Why twice: routed tokens
  // spread around the mean, so a tile of the mean splits about half the experts into two tiles that
  // each stream the expert's weights; for FP8 also the per-tile fixed costs (scale loads, promotion)
  // weigh twice as much against half the weight bytes (docs/PERF.md, "FP8 tuned tables").
  constexpr double kSwapLimit = 16.0;
  plan.swap_ab = orientation == Orientation::kSwapAB ||
                 (orientation == Orientation::kAuto && tokens_per_expert <= kSwapLimit);
  const double tile_tokens = 2.0 * tokens_per_expert;
  if (plan.swap_ab) {
    // FP8 Swap-AB tiles stop at 64 tokens (no 128-token FP8 Swap-AB variant is compiled).
    const int limit = orientation == Orientation::kSwapAB && !fp8 ? 128 : 64;
    plan.token_tile = std::clamp(next_power_of_two(tile_tokens), kMinTokenTile, limit);
  } else {
    // 128-token tiles (two consumer warpgroups) once an expert's tokens fill them; smaller experts
    // would pad most of the 128 token rows.
    plan.token_tile = tile_tokens >= 128.0 ? 128 : 64;
  }
  // Weight tiles: 128 rows (two consumer warpgroups) once Swap-AB tiles hold 16+ tokens — measured
  // 3–6% faster than 64 rows on qwen3-30b-a3b and mixtral-8x7b at T = 64…1024 (docs/PERF.md, v3).
  int weight_tile = 64;
  if (plan.swap_ab && plan.token_tile >= 16 && plan.token_tile <= 64) weight_tile = 128;
  if (fp8 && plan.swap_ab && plan.token_tile >= 16) weight_tile = 128;
  // 128-token normal tiles take 256 weight rows, bf16 and FP8 alike: each token row read from L2 feeds
  // twice the MACs. (FP8 128×256 tiles run as two 128-row weight halves: two accumulators would not fit
  // the registers.) FP8, H100, forced pairs 128×128 → 128×256: 0.93–0.98 from 256 tokens per expert on,
  // 0.94–1.03 at 64–128 (geomean 0.99; docs/PERF.md, "Twentieth session").
  if (!plan.swap_ab) weight_tile = plan.token_tile == 128 ? 256 : 128;
  // GEMM1 reads x rows in place (no gather launch) while the layer has few (token, slot) pairs;
  // FP8 rows are quantised by the gather kernel, so FP8 always gathers.
  const bool gather_in_gemm = !fp8 && plan.swap_ab && plan.token_tile == 8 &&
                              static_cast<long long>(num_tokens) * spec.top_k <= kMaxInGemmGatherRows;
  plan.gemm1 = gemm::find_gemm_variant(gemm::EpilogueKind::kSwiGlu, quant, plan.swap_ab, plan.token_tile, weight_tile,
                                       gather_in_gemm);
  // GEMM2's 128×256 tiles run 3 stages (the only depth FP8 has): the 4-stage bf16 tile has no room for its
  // 64 KB output tile beside the stages and writes straight from the fragment, the 3-stage one stages it
  // and stores it by TMA — −4 to −14 % on H200 at 4096–16384 (docs/DISPATCH.md, GemmConfig::kTmaStore).
  const int gemm2_stages = !plan.swap_ab && weight_tile == 256 ? 3 : 0;
  plan.gemm2 = gemm::find_gemm_variant(gemm::EpilogueKind::kRoutingWeight, quant, plan.swap_ab, plan.token_tile,
                                       weight_tile, false, gemm2_stages);
  if (plan.gemm1 == nullptr || plan.gemm2 == nullptr)
    throw Error("hmoe: no compiled GEMM variant for orientation " + std::string(plan.swap_ab ? "swap" : "normal") +
                " with token tile " + std::to_string(plan.token_tile));
  return plan;
}

Plan batch_invariant_plan(const MoeSpec& spec) {
  // NOTE: one variant for every T is what makes the bits T-independent: a wgmma output row
  // depends only on its own operand row and the K order, which one variant fixes (RELIABILITY.md).
  // Normal orientation at 64 tokens is the smallest normal tile, so decode pads least.
  constexpr int kTokenTile = 64;
  constexpr int kWeightTile = 128;
  Plan plan;
  plan.swap_ab = false;
  plan.token_tile = kTokenTile;
  for (const gemm::GemmVariant& variant : gemm::gemm_variants()) {
    if (variant.swap_ab || variant.token_tile != kTokenTile || variant.weight_tile != kWeightTile ||
        variant.quant != gemm::quant_kind(spec) || variant.gather_tokens)
      continue;
    if (variant.epilogue == gemm::EpilogueKind::kSwiGlu) plan.gemm1 = &variant;
    if (variant.epilogue == gemm::EpilogueKind::kRoutingWeight) plan.gemm2 = &variant;
  }
  if (plan.gemm1 == nullptr || plan.gemm2 == nullptr)
    throw Error("hmoe: batch-invariant mode needs the normal 64x128 GEMM variants, which are not compiled");
  plan.source = "batch-invariant";
  return plan;
}

Plan plan_for(const MoeSpec& spec, int num_tokens, Orientation orientation, const PlanOverrides* overrides) {
  return spec.batch_invariant ? batch_invariant_plan(spec) : choose_plan(spec, num_tokens, orientation, overrides);
}

WorkspaceLayout workspace_layout(const MoeSpec& spec, int max_tokens) {
  const std::size_t entries = static_cast<std::size_t>(max_tokens) * spec.top_k;
  const std::size_t experts = spec.num_experts;
  WorkspaceLayout layout;
  std::size_t offset = 0;
  auto region = [&offset](std::size_t bytes) {
    const std::size_t start = offset;
    offset += (bytes + 255) / 256 * 256;
    return start;
  };
  layout.topk_ids = region(entries * 4);
  layout.topk_weights = region(entries * 4);
  layout.expert_counts = region(experts * 4);
  layout.expert_cursor = region(experts * 4);
  layout.expert_offsets = region((experts + 1) * 4);
  layout.num_tiles = region(4);
  layout.tiles = region(static_cast<std::size_t>(max_token_tiles(static_cast<long long>(entries), spec.num_experts,
                                                                 kMinTokenTile)) * sizeof(TokenTile));
  layout.slot_rows = region(entries * 4);
  layout.row_weights = region(entries * 4);
  layout.sorted_tokens = region(entries * 4);
  layout.sorted_rows = region(entries * spec.hidden * 2);
  layout.intermediate = region(entries * spec.intermediate * 2);
  if (spec.weight_dtype == WeightDType::kFP8E4M3) {
    // Scales of the quantised rows: per 1×128 group, per row, or one per tensor (+ its amax).
    const auto scale_floats = [&](int cols) -> std::size_t {
      switch (spec.scheme) {
        case QuantScheme::kBlock128: return entries * (cols / 128);
        case QuantScheme::kPerChannelPerToken: return entries;
        default: return 2;
      }
    };
    layout.x_scales = region(scale_floats(spec.hidden) * 4);
    layout.intermediate_fp8 = region(entries * spec.intermediate);
    layout.intermediate_scales = region(scale_floats(spec.intermediate) * 4);
  }
  if (!spec.batch_invariant) {
    layout.split_partials = region(static_cast<std::size_t>(gemm::kSplitPartialFloats) * 4);
    layout.split_counters = region(static_cast<std::size_t>(gemm::kSplitCounters) * 4);
  }
  layout.total = offset;
  return layout;
}

int fused_decode_environment() {
  static const int from_environment = [] {
    const char* value = std::getenv("HMOE_FUSED_DECODE");
    return value == nullptr ? -1 : std::strcmp(value, "0") != 0 ? 1 : 0;
  }();
  return from_environment;
}

std::string_view fused_decode_source(const MoeSpec& spec, const PlanOptions& options, const PlanOverrides* overrides,
                                     int num_tokens, int environment) {
  // Anything that asks for particular GEMMs, stages or splits runs the kernels it names.
  if (spec.batch_invariant || options.skip_stages != 0 || options.orientation != Orientation::kAuto ||
      !options.force_variant.empty() || options.split_k != 0)
    return {};
  std::string_view source;
  if (environment >= 0) {
    source = environment == 1 ? "environment" : "";
  } else if (options.fused_decode == FusedDecode::kOn) {
    source = "option";
  } else if (options.fused_decode == FusedDecode::kAuto && overrides != nullptr && overrides->tuned != nullptr &&
             overrides->tuned->bucket_for(num_tokens).fused_decode) {
    // NOTE: the bucket nearest T may serve a T the layer does not cover (T = 5 → bucket 4): then
    // decode::applies below says no and the bucket's unfused pair runs.
    source = overrides->tuned->source;
  }
  return !source.empty() && decode::applies(spec, num_tokens) ? source : std::string_view();
}

bool fuses_at_any_decode_size(const MoeSpec& spec, const PlanOptions& options, const PlanOverrides* overrides,
                              int chunk_tokens, int environment) {
  for (int tokens = 1; tokens <= std::min(chunk_tokens, decode::kMaxTokens); ++tokens)
    if (!fused_decode_source(spec, options, overrides, tokens, environment).empty()) return true;
  return false;
}

int warm_up_tokens(const MoeSpec& small, int token_tile, int weight_tile, long long want_tiles, int most) {
  const long long experts = std::max(small.num_experts, 1);
  const long long weight_tiles = std::max(small.hidden / std::max(weight_tile, 1), 1);
  const long long token_tiles = (std::max(want_tiles, 1LL) + experts * weight_tiles - 1) / (experts * weight_tiles);
  const long long slots = experts * token_tiles * std::max(token_tile, 1);
  const long long tokens = (slots + std::max(small.top_k, 1) - 1) / std::max(small.top_k, 1);
  return static_cast<int>(std::clamp<long long>(tokens, 1, std::max(most, 1)));
}

int choose_splits(const gemm::GemmVariant& variant, long long output_tiles, int k, int num_sms, int requested) {
  // Splits along K shorter than this many K blocks (stages) would leave the pipeline half-filled.
  constexpr int kMinSplitKBlocks = 8;
  constexpr int kMaxSplits = 8;
  if (requested == 1 || !variant.split_k || output_tiles <= 0 || output_tiles > gemm::kSplitCounters) return 1;
  const int k_step = gemm::kTileRowBytes / (variant.quant == gemm::QuantKind::kNone ? 2 : 1);   // GemmConfig::kBlockK
  const long long tile_floats = static_cast<long long>(variant.token_tile) * variant.weight_tile;
  const long long fit = gemm::kSplitPartialFloats / (output_tiles * tile_floats);
  const int most = static_cast<int>(std::min<long long>({kMaxSplits, (k + k_step - 1) / k_step / kMinSplitKBlocks, fit}));
  if (most < 2) return 1;
  if (requested > 1) return std::min(requested, most);
  // NOTE: at decode a GEMM streams weights, and one SM's share of the stream is what limits it
  // (deepseek-v3's GEMM1 at T = 1: 64 tiles on 64 of 132 SMs, 18.3 µs for a 6.3 µs floor, H200).
  // So split only while the tiles leave SMs idle: measured on H200 at T = 1 (docs/PERF.md, "Split
  // along K"), deepseek-v3 64 tiles → 2 splits −3.2 µs (fp8-block) and −6.0 µs (bf16),
  // qwen3-235b 96 tiles → 4 splits −3.0 µs, but qwen3-30b's 192 tiles (1.45 waves) → 2 splits
  // +2.0 µs. With S splits the busiest SM streams ⌈tiles·S / SMs⌉ items of 1/S of K each: take
  // the smallest S that minimises that, and only when it saves at least 10% (each split adds a
  // partial's round trip through L2 and the last CTA's sum).
  if (num_sms <= 0 || output_tiles >= num_sms) return 1;
  const auto cost = [&](int splits) {
    return static_cast<double>((output_tiles * splits + num_sms - 1) / num_sms) / splits;
  };
  int best = 1;
  for (int splits = 2; splits <= most; ++splits)
    if (cost(splits) < cost(best)) best = splits;
  return cost(best) <= 0.9 * cost(1) ? best : 1;
}

int chunk_tokens(const MoeSpec& spec, int max_tokens, std::size_t max_workspace_bytes) {
  if (max_workspace_bytes == 0 || workspace_layout(spec, max_tokens).total <= max_workspace_bytes) return max_tokens;
  const std::size_t one_token = workspace_layout(spec, 1).total;
  if (one_token > max_workspace_bytes)
    throw Error("hmoe: invalid PlanOptions.max_workspace_bytes = " + std::to_string(max_workspace_bytes) +
                ": expected 0 (no cap) or at least " + std::to_string(one_token) +
                " (the workspace of a one-token chunk)");
  // Every region grows with the token count, so the layout size is monotone: bisect for the
  // largest count that fits (fits(low) holds, fits(high) does not).
  int low = 1, high = max_tokens;
  while (high - low > 1) {
    const int middle = low + (high - low) / 2;
    if (workspace_layout(spec, middle).total <= max_workspace_bytes) low = middle; else high = middle;
  }
  return low;
}

}  // namespace hmoe::dispatch
