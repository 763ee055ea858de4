// What a GEMM variant is (orientation, tile shape, pipeline depth, epilogue) and what one launch
// needs; shared by the kernels, their generated instantiations and the dispatcher.
#pragma once

#include <cuda_runtime_api.h>

#include "permute/work_list.hpp"

namespace hmoe::gemm {

enum class EpilogueKind {
  kSwiGlu,         // GEMM1: silu(gate) ⊙ up → bf16 intermediate [rows, I]
  kRoutingWeight,  // GEMM2: × routing weight of the row → bf16 [rows, H]
};

// Rows of the prepared w13 come in groups of 16: 8 gate rows then the 8 up rows of the same 8
// intermediate columns. NOTE: with that grouping one thread's wgmma accumulator fragment holds
// both halves of every SwiGLU pair in either orientation (columns 8j and 8j+8 when weights are
// WGMMA's N side, rows r and r+8 when they are its M side), so the epilogue needs no exchange.
inline constexpr int kSwiGluGroupRows = 16;

// The checkpoint row (0..I-1 gate, I..2I-1 up) that prepared w13 row `row` of an expert holds.
__host__ __device__ constexpr int swiglu_source_row(int row, int intermediate) {
  const int group = row / kSwiGluGroupRows, within = row % kSwiGluGroupRows, half = kSwiGluGroupRows / 2;
  return within < half ? group * half + within : intermediate + group * half + (within - half);
}

// What the operands hold and where their FP8 scales are applied.
enum class QuantKind {
  kNone,            // bf16 operands
  kEpilogueScale,   // e4m3 operands, one scale per weight row (or per expert) × one per token (or per
                    // tensor): applied once to the fp32 accumulator before the epilogue
  kBlockScale,      // e4m3 operands, 128×128 weight blocks × 1×128 token groups: each 128-wide K block
                    // is accumulated apart and promoted into the total with its two scales
};

inline constexpr int kTileRowBytes = 128;   // one swizzled shared-memory row: 64 bf16 or 128 e4m3
inline constexpr int kScaleGroup = 128;     // K (and weight rows) per FP8 block scale

// GEMM1 variants whose epilogue can also write the SwiGLU output already re-quantised for GEMM2 instead of
// bf16 for a separate pass: the normal-orientation tiles of 256 weight rows, whose 128 output columns are
// exactly one 1×128 group — block-scaled ones write e4m3 values and their group scales (GemmLaunch::out_scales;
// each row's 128 values lie in one quad of one warp, so the group's amax is two shuffles), per-tensor ones
// e4m3 values under a static scale (GemmLaunch::out_static_scale, fp8-tensor's intermediate_act_scale).
// NOTE: narrower tiles hold part of a group, and a cross-tile amax measured slower than the separate
// pass (docs/PERF.md, "Fused re-quantisation v1/v2"); per-token and dynamic per-tensor scales span rows.
__host__ __device__ constexpr bool fuses_requant(EpilogueKind epilogue, bool swap_ab, int weight_tile, QuantKind quant) {
  return epilogue == EpilogueKind::kSwiGlu && !swap_ab && weight_tile == 2 * kScaleGroup && quant != QuantKind::kNone;
}

template <EpilogueKind kEpilogue_, bool kSwapAB_, int kTokenTile_, int kWeightTile_, int kStages_,
          bool kGatherTokens_ = false, QuantKind kQuant_ = QuantKind::kNone>
struct GemmConfig {
  static constexpr EpilogueKind kEpilogue = kEpilogue_;
  static constexpr bool kSwapAB = kSwapAB_;
  static constexpr int kTokenTile = kTokenTile_;     // token rows per tile
  static constexpr int kWeightTile = kWeightTile_;   // weight rows per tile
  static constexpr int kStages = kStages_;
  static constexpr QuantKind kQuant = kQuant_;
  static constexpr bool kFp8 = kQuant != QuantKind::kNone;
  static constexpr int kElementBytes = kFp8 ? 1 : 2;
  // K elements per stage: one 128-byte row (for FP8 exactly one block-scale group).
  static constexpr int kBlockK = kTileRowBytes / kElementBytes;
  // WGMMA's A operand: 64 rows per consumer warpgroup; B is the other operand, shared by them.
  static constexpr int kTileM = kSwapAB ? kWeightTile : kTokenTile;
  static constexpr int kTileN = kSwapAB ? kTokenTile : kWeightTile;
  static constexpr int kConsumers = kTileM / 64;
  // Token rows read straight from x through the permute stage's row → token index, one 128-byte
  // TMA box per row, instead of from a gathered copy. NOTE: it saves the gather launch at decode
  // sizes, but each row request costs ~60 cycles of TMA issue: at 128-row tiles it made prefill
  // 2.8× slower (docs/PERF.md, v3), so only small token tiles gather.
  static constexpr bool kGatherTokens = kGatherTokens_;
  static_assert(!kGatherTokens || kEpilogue == EpilogueKind::kSwiGlu, "only GEMM1 reads x");
  static_assert(kTileM == 64 || kTileM == 128, "one or two consumer warpgroups of 64 rows each");
  // Normal-orientation gathering tiles (prefill) land their token rows with cp.async instead: the
  // whole producer warpgroup issues 16 bytes a thread a request, 8 requests a thread a stage for a
  // 128-row tile, and each thread's arrival on the stage's full barrier (cp.async.mbarrier.arrive)
  // fires when its requests have landed. It takes the bf16 gather pass (T·k·H·2 bytes written, and
  // read again by GEMM1) off the layer; x stays in L2 while its rows are read k times.
  // FP8: the gathered rows are x quantised in token order (T rows of e4m3, quant::launch_quantize_rows with
  // ActivationRows::values_by_token), not expert-sorted copies of them; their scales stay per sorted row.
  static constexpr bool kGatherCpAsync = kGatherTokens && !kSwapAB;
  static constexpr int kGatherThreads = kGatherCpAsync ? 128 : 0;
  static_assert(!kGatherCpAsync || kTileM == 128, "the producer warpgroup (two consumers) gathers the rows");
  static_assert(!kGatherTokens || !kFp8 || kGatherCpAsync, "FP8 rows are gathered only by the normal tiles");
  // FP8 keeps a second fp32 accumulator for the per-K-block promotion: at 2 × 128 floats a thread
  // (128×256 tiles) ptxas spilled both to local memory, measured on H200 (docs/PERF.md). The FP8
  // 128×256 tiles therefore multiply each K block in two halves of 128 weight rows, one 64-float
  // partial each, promoted one after the other (consume_promoted_halves): 128 + 64 floats a thread,
  // and a quarter fewer operand bytes from L2 per FLOP than 128×128 tiles.
  static constexpr bool kFp8Halves = kFp8 && !kSwapAB && kTileN == 256;
  static_assert(!kFp8 || kTileN <= 128 || (kFp8Halves && kConsumers == 2),
                "two FP8 accumulators must fit the registers: 256 weight rows only as two-consumer halves");
  // NOTE: block scales are applied per 128 K, so a K block must not straddle two weight blocks,
  // and each 128-row weight half of a tile must fall in one 128-row block per SwiGLU half (tiles are
  // aligned; GEMM1's 256-row tiles hold the gate and up rows of 128 intermediate columns).
  static_assert(kQuant != QuantKind::kBlockScale || kWeightTile <= kScaleGroup || kFp8Halves,
                "one weight scale block per tile half");
  static constexpr bool kFusedRequant = fuses_requant(kEpilogue, kSwapAB, kWeightTile, kQuant);
  // GEMM1 with one dequantisation scale applied in the epilogue (fp8-tensor, fp8-channel): the epilogue can
  // also keep the amax of its bf16 output (GemmLaunch::out_amax), in either orientation.
  static constexpr bool kKeepsAmax = kEpilogue == EpilogueKind::kSwiGlu && kQuant == QuantKind::kEpilogueScale;
  static_assert(kTileN % 8 == 0 && kTileN >= 8 && kTileN <= 256, "wgmma N is a multiple of 8 up to 256");
  static constexpr int kABytes = kTileM * kTileRowBytes;
  static constexpr int kBBytes = kTileN * kTileRowBytes;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "swizzle atoms are 1024 bytes");
  // Normal tiles write their bf16 output (GEMM1's SwiGLU half as many columns as weight rows, GEMM2's
  // one a weight row) through shared memory and TMA, whole 128-byte lines, where the output is whole
  // 64-column boxes and the staged tile fits beside the stages without lowering the CTAs an SM the
  // variant is built for (two for one consumer, one for two): GEMM2's FP8 128×128 tiles, its 3-stage
  // 64×128 and 128×256 ones, its FP8 64×64 block tiles; GEMM1's 128-token tiles (128×128, 128×256).
  // NOTE: GEMM1's 64-token tiles keep the direct stores: they run at 16–64 tokens an expert, where most
  // items are an expert's partial last tile, and with the staged tile (8 KB more a CTA) qwen3-30b-a3b
  // fp8-block T = 256 / 512 measured 1.3 / 1.2 % slower on an H100 (docs/PERF.md, twenty-first session).
  // NOTE: written straight from the fragment, each warp store put 16 bytes into each of 8 rows: the
  // 470 MB of deepseek-v3-tp8's GEMM2 output at T = 4096 reached L2 as ~29 M half-sector writes, and
  // the load/store queue throttled the consumers (ncu: docs/PERF.md, fourteenth session); GEMM1's
  // 128×256 items spent ~9 k of their ~40 k cycles in such an epilogue (trace, twenty-first session).
  static constexpr int kOutputColumns = kEpilogue == EpilogueKind::kSwiGlu ? kTileN / 2 : kTileN;   // normal tiles
  static constexpr int kStoreBytes = kTileM * kOutputColumns * 2;
  static constexpr int kMaxSmemBytes = 232448;      // sm_90: shared memory a block may opt in to
  static constexpr int kSmemPerSm = 233472;         // sm_90: shared memory of one SM
  static constexpr int kCtaOverheadBytes = 2048;    // the driver's reserved 1 KB a CTA + the kernel's static 1 KB
  static constexpr int kDesignedCtasPerSm = kTileM == 128 ? 1 : 2;
  // The dynamic shared memory with the staged tile (kSmemBytes below when kTmaStore).
  static constexpr int kStagedSmemBytes = kStages * kStageBytes + kStoreBytes + 1024 + 2 * kStages * 8;
  static constexpr bool kTmaStore = !kSwapAB && kOutputColumns % 64 == 0 &&
                                    (kEpilogue == EpilogueKind::kRoutingWeight || kTokenTile == 128) &&
                                    kStagedSmemBytes + kCtaOverheadBytes / 2 <= kMaxSmemBytes &&
                                    kDesignedCtasPerSm * (kStagedSmemBytes + kCtaOverheadBytes) <= kSmemPerSm;
  // Dynamic shared memory: the stages, the staged output tile (kTmaStore), then the barriers.
  static constexpr int kStoreTileOffset = kStages * kStageBytes;
  static constexpr int kBarrierOffset = kStoreTileOffset + (kTmaStore ? kStoreBytes : 0);
  // + 1024 to align the dynamic buffer, + the barriers.
  static constexpr int kSmemBytes = kBarrierOffset + 1024 + 2 * kStages * 8;
  // Consumer warpgroup(s) + the producer. NOTE: with two consumers the producer is a whole
  // warpgroup, since handing registers over (setmaxnreg) works per warpgroup; with one it is a single
  // warp, so 160 threads × up to 204 registers let two CTAs share an SM where 256 threads let one
  // (the FP8 64×128 normal tiles: 161 registers).
  static constexpr int kThreads = kConsumers == 2 ? 128 * 3 : 128 + 32;
  // Whether launches may split K over several CTAs (GemmLaunch::splits). NOTE: only Swap-AB tiles,
  // the decode-size variants: their fragments are a few floats, and normal-orientation tiles run
  // where there are already more work items than SMs.
  static constexpr bool kSplitK = kSwapAB;
  static constexpr int kTileFloats = kTileM * kTileN;   // one work item's fp32 partial sum
};

// The split along K (GemmLaunch::splits): each split's fp32 partial of a tile goes to a workspace
// region of at most this many floats, and one arrival counter per output tile decides who sums.
inline constexpr long long kSplitPartialFloats = 1 << 19;   // 2 MiB
inline constexpr int kSplitCounters = 4096;

// One launch: tokens [token_rows, K] (expert-sorted), weights [experts × weight_rows, K], bf16 or e4m3.
struct GemmLaunch {
  const void* tokens = nullptr;
  int token_rows = 0;            // rows in the token buffer (TMA bound)
  const int* token_index = nullptr;  // gathering variants: expert-sorted row → row of `tokens`
  // Expert-sorted rows, the rows of `out` (its TMA bound) and of the work list: token_rows, unless
  // the variant gathers, where the token buffer is x (T rows) and there are T·k sorted rows.
  int sorted_rows = 0;
  const void* weights = nullptr;
  int experts = 0;
  int weight_rows = 0;           // N per expert: 2I for GEMM1, H for GEMM2
  int k = 0;                     // H for GEMM1, I for GEMM2
  WorkList work;
  int max_tiles = 0;             // upper bound of *work.num_tiles, sizes the grid
  void* out = nullptr;           // [sorted_rows, out_cols] bf16
  int out_cols = 0;
  const float* row_weights = nullptr;  // [token_rows], kRoutingWeight only
  int num_sms = 0;
  // FP8 variants: dequantisation scales (QuantScheme layouts: weights per expert [E], per row
  // [E, N] or per block [E, N/128, K/128]; tokens per tensor [1], per row [token_rows] or per
  // 1×128 group [token_rows, K/128]).
  const float* weight_scale = nullptr;
  const float* token_scale = nullptr;
  bool per_row_scales = false;   // kEpilogueScale: per-channel × per-token (else per-tensor)
  // Split along K (kSplitK variants): `splits` CTAs each multiply a contiguous range of K blocks of
  // one output tile, store the fp32 partial in split_partials, and the last to arrive at the tile's
  // counter sums all partials in split order, then runs the epilogue. The counters
  // ([kSplitCounters] ints) must be zero at launch; the launch leaves them zero.
  int splits = 1;
  float* split_partials = nullptr;   // [kSplitPartialFloats]
  int* split_counters = nullptr;     // [kSplitCounters]
  // GEMM1, Config::kFusedRequant variants only (fuses_requant): when set, `out` receives the SwiGLU
  // output as e4m3 [token_rows, out_cols] and out_scales its 1×128 group scales [token_rows,
  // out_cols / 128] — the values and scales quant::launch_quantize_rows would make of the bf16 output,
  // bit for bit (amax of the bf16-rounded values, amax / 448, UE8M0 when ue8m0; docs/FP8.md).
  // Block-scaled variants only.
  float* out_scales = nullptr;
  bool ue8m0 = false;
  // The same for per-tensor (kEpilogueScale) kFusedRequant variants with a static scale: `out` receives
  // e4m3(bf16 value / *out_static_scale), as launch_quantize_rows with that static scale would write.
  const float* out_static_scale = nullptr;
  // GEMM1, Config::kKeepsAmax variants only: when set, the epilogue also raises *out_amax (which the
  // caller zeroed) to the largest |value| of the bf16 output it writes — the amax a dynamic per-tensor
  // re-quantisation needs (quant::ActivationRows::amax_ready), without a pass over the output for it.
  float* out_amax = nullptr;
  // Programmatic dependent launch (common/launch.cuh): the kernel may launch while the one before
  // it on the stream finishes.
  bool pdl = false;
};

}  // namespace hmoe::gemm
