// Permute stage: from top-k ids, count tokens per expert, build the GEMM work list, and give each
// (token, slot) pair a row in expert-sorted order, then gather x into those rows — all on the
// device, no host synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include "hmoe/hmoe.hpp"
#include "permute/work_list.hpp"

namespace hmoe::permute {

// Device slots the later stages accumulate into with atomics, zeroed by the permute stage's own kernels
// so that a layer enqueues no memset for them: the GEMMs' split-K counters, and the dynamic fp8-tensor amax
// slots (x's, and GEMM1's output's when its epilogue keeps the amax). Null pointers are skipped.
struct ZeroedSlots {
  int* counters = nullptr;   // [counter_count]
  int counter_count = 0;
  float* amax[2] = {nullptr, nullptr};
};

struct PermuteBuffers {
  int* expert_counts;       // [E], zeroed by launch_permute
  int* expert_cursor;       // [E]
  int* expert_offsets;      // [E + 1]
  int* num_tiles;           // [1]
  TokenTile* tiles;         // [max_token_tiles(T·k, E, token_tile)]
  int* slot_rows;           // [T·k]: sorted row of (token, slot), -1 for an invalid id
  float* row_weights;       // [T·k]: routing weight of each sorted row
  int* sorted_tokens;       // [T·k]: token of each sorted row
  void* sorted_x;           // [T·k, H] bf16: x rows in expert-sorted order (GEMM1's token operand)
  ZeroedSlots zeroed;        // zeroed by the stage's kernels for the stages after it
};

// Up to this many (token, slot) pairs one block does the whole stage (T ≤ 1024 at k = 8); above it
// the count and the row assignment spread over the chip.
inline constexpr int kSingleBlockEntries = 8192;

// How x reaches the expert-sorted rows (sorted_x; FP8 layers quantise it on the way instead,
// quant::launch_quantize_rows, the same two ways).
enum class GatherX {
  kNone,       // not here: GEMM1 reads x through sorted_tokens, or the FP8 quantisation writes the rows
  kPerRow,     // one warp per sorted row copies its token's x row: x is read k times
  kPerToken,   // each x row is read once and written to its k rows (slot_rows)
};

// Prefill with k > 1: above this many (token, slot) pairs x is gathered (or quantised) per token.
// Reading each x row once instead of k times cuts the stage's traffic by a third for bf16 and by
// 0.6 for FP8 (deepseek-v3-tp8 T = 4096: x is 59 MB, read eight times 470 MB, mostly from DRAM
// since x does not stay in L2 next to the rest); qwen3-30b-a3b, whose x stays in L2, gained too
// (−5 % at T = 2048: k times fewer loads and blocks). Decode sizes keep a block or warp per row,
// the most parallel walk of a small x. HMOE_SCATTER_X=0 turns the per-token walk off (A/B timing;
// read when a runner is planned).
inline constexpr int kScatterXEntries = 2048;
inline bool scatter_x_rows(int num_tokens, int top_k) {
  return top_k > 1 && static_cast<long long>(num_tokens) * top_k > kScatterXEntries;
}
bool scatter_x_environment();

// Enqueues the stage: one launch up to kSingleBlockEntries (token, slot) pairs; above, a memset of
// expert_counts and three launches (the work-list kernel zeroes buffers.zeroed); plus
// the gather of x into sorted_x as `gather` says. x rows are 16-byte aligned (H % 8 == 0). pdl: its
// kernels may launch while the kernel before them on the stream finishes (common/launch.cuh).
void launch_permute(const int* topk_ids, const float* topk_weights, const void* x, int num_tokens, int top_k,
                    int experts, int hidden, int token_tile, GatherX gather, const PermuteBuffers& buffers,
                    int* invalid_id_count, cudaStream_t stream, bool pdl = false);

// Decode sizes: the routing stage (from logits) and this stage in one kernel of one block, one launch
// fewer (route_permute.cu). Writes topk_ids / topk_weights [T, k] as routing::launch_topk would, then
// everything launch_permute does but the x gather (callers that need it use launch_permute).
inline constexpr int kRoutePermuteTokens = 16;    // one routing warp per token; their shared memory
inline constexpr int kRoutePermuteExperts = 256;  // fits the 48 KB of a block's static shared memory
bool route_permute_applies(const MoeSpec& spec, int num_tokens);
void launch_route_permute(const MoeSpec& spec, const void* logits, const float* correction_bias, int num_tokens,
                          int* topk_ids, float* topk_weights, int token_tile, const PermuteBuffers& buffers,
                          int* invalid_id_count, cudaStream_t stream);
// Loads the fused kernel this spec would use (module loading is lazy); nothing when it never applies.
void prepare_route_permute(const MoeSpec& spec);

// Loads the stage's kernels (module loading is lazy), so the first run costs what later runs do.
void prepare();

}  // namespace hmoe::permute
