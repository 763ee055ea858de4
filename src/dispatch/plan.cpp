// Orientation and tile choice (an analytic rule until tuned tables exist) and the workspace layout.
#include "dispatch/plan.hpp"

#include <algorithm>

#include "permute/work_list.hpp"

namespace hmoe::dispatch {
namespace {

int next_power_of_two(double value) {
  int power = 1;
  while (power < value) power *= 2;
  return power;
}

}  // namespace

Plan choose_plan(const MoeSpec& spec, int num_tokens, Orientation orientation) {
  const double tokens_per_expert = static_cast<double>(num_tokens) * spec.top_k / spec.num_experts;
  Plan plan;
  // Swap-AB while an expert's tokens would fill less than one 64-row WGMMA tile: the weight rows
  // then fill WGMMA's M side and the tokens are padded only to a multiple of 8 on N.
  plan.swap_ab = orientation == Orientation::kSwapAB ||
                 (orientation == Orientation::kAuto && tokens_per_expert <= 64.0);
  if (plan.swap_ab) {
    const int limit = orientation == Orientation::kSwapAB ? 128 : 64;
    plan.token_tile = std::clamp(next_power_of_two(tokens_per_expert), kMinTokenTile, limit);
  } else {
    // 128×256 tiles (two consumer warpgroups) once an expert's tokens fill them; smaller experts
    // would pad most of the 128 token rows.
    plan.token_tile = tokens_per_expert >= 128.0 ? 128 : 64;
  }
  plan.gemm1 = gemm::find_gemm_variant(gemm::EpilogueKind::kSwiGlu, plan.swap_ab, plan.token_tile);
  plan.gemm2 = gemm::find_gemm_variant(gemm::EpilogueKind::kRoutingWeight, plan.swap_ab, plan.token_tile);
  if (plan.gemm1 == nullptr || plan.gemm2 == nullptr)
    throw Error("hmoe: no compiled GEMM variant for orientation " + std::string(plan.swap_ab ? "swap" : "normal") +
                " with token tile " + std::to_string(plan.token_tile));
  return plan;
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
  layout.total = offset;
  return layout;
}

}  // namespace hmoe::dispatch
