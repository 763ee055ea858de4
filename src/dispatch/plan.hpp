// The dispatcher's choices for one run: orientation, token tile and the two GEMM variants, and
// the workspace layout every run of a runner shares.
#pragma once

#include <cstddef>

#include "gemm/variants.hpp"
#include "hmoe/hmoe.hpp"

namespace hmoe::dispatch {

struct Plan {
  bool swap_ab = false;
  int token_tile = 0;
  const gemm::GemmVariant* gemm1 = nullptr;
  const gemm::GemmVariant* gemm2 = nullptr;
};

Plan choose_plan(const MoeSpec& spec, int num_tokens, Orientation orientation);

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
  std::size_t sorted_rows = 0;    // [T·k, H] bf16: gathered x, then (reused) GEMM2's output
  std::size_t intermediate = 0;   // [T·k, I] bf16: SwiGLU output
  std::size_t total = 0;
};

// Smallest token tile any plan uses; the tile list is sized for it.
inline constexpr int kMinTokenTile = 8;

WorkspaceLayout workspace_layout(const MoeSpec& spec, int max_tokens);

}  // namespace hmoe::dispatch
