// The TMA → WGMMA mainloop shared by both orientations: a producer thread fills a ring of
// shared-memory stages, the consumer warpgroup multiplies them into fp32 registers.
#pragma once

#include <utility>

#include "gemm/config.hpp"
#include "gemm/ptx.cuh"
#include "gemm/scheduler.cuh"
#include "gemm/trace.cuh"

namespace hmoe::gemm {

template <class Config>
struct SharedStorage {
  std::uint8_t* base;        // 1024-byte aligned
  std::uint64_t* full;       // [kStages]: TMA bytes landed
  std::uint64_t* empty;      // [kStages]: consumer warps done reading

  __device__ std::uint8_t* a_tile(int stage) const { return base + stage * Config::kStageBytes; }
  __device__ std::uint8_t* b_tile(int stage) const { return a_tile(stage) + Config::kABytes; }
  // Config::kTmaStore: the output tile staged for its TMA store, after the stages (1024-byte aligned).
  __device__ std::uint8_t* store_tile() const { return base + Config::kStoreTileOffset; }
};

// Ring position shared by producer and consumer; the phase bit flips each time the ring wraps.
struct PipelineState {
  int stage = 0;
  std::uint32_t phase = 0;
  template <int kStages>
  __device__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// The producer warp: lane 0 waits for a free stage and loads the weight tile with one TMA box; the
// token tile is one TMA box of contiguous expert-sorted rows or, for gathering variants, one
// 128-byte box per token row issued by all 32 lanes. NOTE: the 128-byte swizzle is a function of
// the shared-memory address, so rows landed one by one at 128-byte steps form the same tile.
template <class Config>
__device__ void produce(const SharedStorage<Config>& smem, const CUtensorMap* token_map,
                        const CUtensorMap* weight_map, const int* token_index, PersistentScheduler scheduler,
                        int weight_rows, const trace::LaunchTrace& launch_trace) {
  constexpr int kRowsPerLane = (Config::kTokenTile + 31) / 32;
  constexpr int kRowBytes = kTileRowBytes;
  constexpr int kBlockK = Config::kBlockK;
  constexpr int kWeightBytes = Config::kWeightTile * kRowBytes;
  const int lane = threadIdx.x % 32;
  [[maybe_unused]] std::uint32_t item_count = 0, records = 0;   // the timeline (trace builds only)
  PipelineState state;
  WorkItem item;
  while (scheduler.next(item)) {
    [[maybe_unused]] const std::uint32_t item_index = item_count++;
    const int weight_row = item.tokens.expert * weight_rows + item.weight_tile * Config::kWeightTile;
    const int token_rows = item.tokens.row_end - item.tokens.row_begin;
    int gathered_row[kRowsPerLane];
    #pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      const int row = lane + 32 * i;
      gathered_row[i] = Config::kGatherTokens && row < token_rows ? token_index[item.tokens.row_begin + row] : -1;
    }
    // A gathering stage lands only the tile's valid rows; the rest of the tile keeps stale rows
    // whose products the epilogue never writes (each output row depends on its own input row only).
    const std::uint32_t stage_bytes =
        Config::kGatherTokens ? kWeightBytes + token_rows * kRowBytes : Config::kStageBytes;
    for (int k_block = item.k_begin; k_block < item.k_end; ++k_block) {
      std::uint8_t* token_tile = Config::kSwapAB ? smem.b_tile(state.stage) : smem.a_tile(state.stage);
      std::uint8_t* weight_tile = Config::kSwapAB ? smem.a_tile(state.stage) : smem.b_tile(state.stage);
      if (lane == 0) {
        // NOTE: parity (phase ^ 1) passes at once on a fresh barrier: every stage starts empty.
        ptx::Barrier::wait(&smem.empty[state.stage], state.phase ^ 1);
        trace::record(launch_trace, 0, records, trace::Event::kStageIssued, item_index, k_block);
        ptx::Barrier::arrive_and_expect_tx(&smem.full[state.stage], stage_bytes);
        ptx::tma_load_2d(weight_map, &smem.full[state.stage], weight_tile, k_block * kBlockK, weight_row);
        if constexpr (!Config::kGatherTokens)
          ptx::tma_load_2d(token_map, &smem.full[state.stage], token_tile, k_block * kBlockK, item.tokens.row_begin);
      }
      if constexpr (Config::kGatherTokens) {
        __syncwarp();
        #pragma unroll
        for (int i = 0; i < kRowsPerLane; ++i) {
          if (gathered_row[i] >= 0)
            ptx::tma_load_2d(token_map, &smem.full[state.stage], token_tile + (lane + 32 * i) * kRowBytes,
                             k_block * kBlockK, gathered_row[i]);
        }
      }
      state.advance<Config::kStages>();
    }
  }
  if (lane == 0) trace::finish(launch_trace, 0, records);
}

// The producer warpgroup of a normal-orientation gathering tile (Config::kGatherCpAsync): thread 0
// loads the weight tile with one TMA box as produce() does, and every thread copies its share of the
// token rows from x (`tokens`, rows of `row_bytes`) through the row → token index: lanes 8 apart take
// the 16-byte chunks of one 128-byte row, so a warp reads 4 rows a request and each thread 8 rows of
// the 128-row tile, always the same chunk. Chunks are stored where the 128-byte swizzle puts them
// (chunk c of row r at 16·(c ^ r % 8)), as TMA would. Rows past the tile's end and bytes past K are
// zero-filled (a stale e4m3 or bf16 pattern could be a NaN, and a zero costs no read).
template <class Config>
__device__ void produce_gathered(const SharedStorage<Config>& smem, const CUtensorMap* weight_map,
                                 const std::uint8_t* tokens, int row_bytes, const int* token_index,
                                 PersistentScheduler scheduler, int weight_rows, const trace::LaunchTrace& launch_trace) {
  static_assert(Config::kGatherCpAsync && !Config::kSwapAB && Config::kGatherThreads == 128);
  constexpr int kRowsPerPass = Config::kGatherThreads / 8;   // 16 rows: 8 chunks of 16 bytes each
  constexpr int kPasses = Config::kTokenTile / kRowsPerPass;
  constexpr int kWeightBytes = Config::kWeightTile * kTileRowBytes;
  const int thread = threadIdx.x % Config::kGatherThreads;
  const int chunk = thread % 8;
  const int first_row = thread / 8;
  // Every row this thread writes is first_row + 16·pass, so all of them sit at the same swizzled chunk.
  const std::uint32_t chunk_offset = static_cast<std::uint32_t>((chunk ^ (first_row % 8)) * 16);
  [[maybe_unused]] std::uint32_t item_count = 0, records = 0;   // the timeline (trace builds only)
  PipelineState state;
  WorkItem item;
  while (scheduler.next(item)) {
    [[maybe_unused]] const std::uint32_t item_index = item_count++;
    const int weight_row = item.tokens.expert * weight_rows + item.weight_tile * Config::kWeightTile;
    const int token_rows = item.tokens.row_end - item.tokens.row_begin;
    const int* tile_tokens = token_index + item.tokens.row_begin;
    for (int k_block = item.k_begin; k_block < item.k_end; ++k_block) {
      // NOTE: parity (phase ^ 1) passes at once on a fresh barrier: every stage starts empty.
      ptx::Barrier::wait(&smem.empty[state.stage], state.phase ^ 1);
      if (thread == 0) {
        trace::record(launch_trace, 0, records, trace::Event::kStageIssued, item_index, k_block);
        ptx::Barrier::arrive_and_expect_tx(&smem.full[state.stage], kWeightBytes);
        ptx::tma_load_2d(weight_map, &smem.full[state.stage], smem.b_tile(state.stage), k_block * Config::kBlockK,
                         weight_row);
      }
      const int column = k_block * kTileRowBytes + chunk * 16;
      const int bytes = max(0, min(16, row_bytes - column));
      const std::uint32_t tile = ptx::smem_address(smem.a_tile(state.stage)) + chunk_offset;
      #pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        // NOTE: the tile's row → token entries are read again each K block (L1 hits): held across
        // the K loop, the 8 of them pushed the 40-register producer into local memory.
        const int row = first_row + kRowsPerPass * pass;
        const bool valid = row < token_rows && bytes > 0;
        const std::uint8_t* source =
            valid ? tokens + static_cast<long long>(__ldg(tile_tokens + row)) * row_bytes + column : tokens;
        ptx::cp_async_16_zfill(tile + (first_row + kRowsPerPass * pass) * kTileRowBytes, source, valid ? bytes : 0);
      }
      ptx::cp_async_arrive_noinc(&smem.full[state.stage]);
      state.advance<Config::kStages>();
    }
  }
  if (thread == 0) trace::finish(launch_trace, 0, records);
}

template <int kTileN, bool kFp8>
struct Wgmma;
#define HMOE_WGMMA(N)                                                                                                  \
  template <>                                                                                                          \
  struct Wgmma<N, false> {                                                                                             \
    using Op = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>; \
  };                                                                                                                   \
  template <>                                                                                                          \
  struct Wgmma<N, true> {                                                                                              \
    using Op = cute::SM90::GMMA::MMA_64x##N##x32_F32E4M3E4M3_SS_TN<>;                                                  \
  };
HMOE_WGMMA(8)
HMOE_WGMMA(16)
HMOE_WGMMA(32)
HMOE_WGMMA(64)
HMOE_WGMMA(128)
HMOE_WGMMA(256)
#undef HMOE_WGMMA

template <int kTileN, bool kFp8, std::size_t... kIndex>
__device__ __forceinline__ void wgmma(std::uint64_t a, std::uint64_t b, float* accumulator, bool accumulate,
                                      std::index_sequence<kIndex...>) {
  Wgmma<kTileN, kFp8>::Op::fma(a, b, accumulator[kIndex]...,
                               accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

// Issues one stage's wgmma batch (one 128-byte K row: 4 × k16 bf16 or 4 × k32 e4m3) for this
// warpgroup's 64 rows of A and kRows weight rows of B from `first_row` on (the whole tile, or one
// 128-row half of a Config::kFp8Halves tile into a 64-float partial). NOTE: either way a k step is
// 32 bytes = 2 units of the descriptor's 16-byte address field.
template <class Config, int kRows = Config::kTileN>
__device__ __forceinline__ void issue_stage(const SharedStorage<Config>& smem, int stage, float* accumulator,
                                            bool accumulate, int first_row = 0) {
  constexpr int kSteps = kTileRowBytes / 32;
  // Each consumer warpgroup multiplies its own 64 rows of A (64 rows × 128 B = 8 KB apart).
  const std::uint64_t a = ptx::sw128_kmajor_descriptor(smem.a_tile(stage) + (threadIdx.x / 128) * 64 * kTileRowBytes);
  const std::uint64_t b = ptx::sw128_kmajor_descriptor(smem.b_tile(stage) + first_row * kTileRowBytes);
  #pragma unroll
  for (int k_step = 0; k_step < kSteps; ++k_step) {
    wgmma<kRows, Config::kFp8>(a + 2 * k_step, b + 2 * k_step, accumulator, accumulate || k_step > 0,
                               std::make_index_sequence<kRows / 2>{});
  }
}

// Accumulates this warpgroup's 64 rows of one work item's [kTileM × kTileN] product over K blocks
// [k_begin, k_end) (never empty) into `accumulator` (the wgmma fragment: element 4j + r sits at row 64·warpgroup + 16·warp + lane/4 +
// 8·(r/2), column 8j + 2·(lane%4) + r%2).
template <class Config>
__device__ void consume(const SharedStorage<Config>& smem, PipelineState& state, int k_begin, int k_end,
                        float (&accumulator)[Config::kTileN / 2]) {
  constexpr int kFragment = Config::kTileN / 2;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  int previous_stage = -1;
  for (int k_block = k_begin; k_block < k_end; ++k_block) {
    ptx::Barrier::wait(&smem.full[state.stage], state.phase);
    #pragma unroll
    for (int i = 0; i < kFragment; ++i) cute::warpgroup_fence_operand(accumulator[i]);
    cute::warpgroup_arrive();
    issue_stage<Config>(smem, state.stage, accumulator, k_block > k_begin);
    cute::warpgroup_commit_batch();
    // Keep one batch in flight: once the previous stage's batch retires, hand its buffer back.
    cute::warpgroup_wait<1>();
    #pragma unroll
    for (int i = 0; i < kFragment; ++i) cute::warpgroup_fence_operand(accumulator[i]);
    if (previous_stage >= 0 && warp_leader) ptx::Barrier::arrive(&smem.empty[previous_stage]);
    previous_stage = state.stage;
    state.advance<Config::kStages>();
  }
  cute::warpgroup_wait<0>();
  #pragma unroll
  for (int i = 0; i < kFragment; ++i) cute::warpgroup_fence_operand(accumulator[i]);
  if (previous_stage >= 0 && warp_leader) ptx::Barrier::arrive(&smem.empty[previous_stage]);
}

// FP8: each K block of [k_begin, k_end) (one stage, 128 K) is multiplied into `partial`, then
// promoted into the fp32 `accumulator` by the Promotion (scales.cuh: `promote`, or `load` then
// `apply` where the scales are fetched while the batch runs) — with its weight-block × token-group
// scale for 128×128 block scales (k_block is absolute, so a split along K finds its blocks'
// scales), as is otherwise (scales.cuh says why). NOTE: the promotion needs the block's wgmma
// retired, so each stage waits for its own batch; another CTA on the SM and the producer's stages
// in flight keep the tensor cores busy meanwhile (two-consumer tiles: consume_promoted_overlapped).
template <class Config, class Promotion>
__device__ void consume_promoted(const SharedStorage<Config>& smem, PipelineState& state, int k_begin, int k_end,
                                 float (&accumulator)[Config::kTileN / 2], const Promotion& promotion) {
  constexpr int kFragment = Config::kTileN / 2;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  float partial[kFragment];
  #pragma unroll
  for (int i = 0; i < kFragment; ++i) accumulator[i] = 0.0f;
  for (int k_block = k_begin; k_block < k_end; ++k_block) {
    ptx::Barrier::wait(&smem.full[state.stage], state.phase);
    #pragma unroll
    for (int i = 0; i < kFragment; ++i) cute::warpgroup_fence_operand(partial[i]);
    cute::warpgroup_arrive();
    issue_stage<Config>(smem, state.stage, partial, false);
    cute::warpgroup_commit_batch();
    // Normal orientation: the block's scales (four a thread) load while its batch runs. NOTE: for
    // the Swap-AB tiles the same measured slower at T = 256 (docs/PERF.md, eighth session).
    [[maybe_unused]] typename Promotion::Loaded scales{};
    if constexpr (!Config::kSwapAB) scales = promotion.load(k_block);
    cute::warpgroup_wait<0>();
    #pragma unroll
    for (int i = 0; i < kFragment; ++i) cute::warpgroup_fence_operand(partial[i]);
    if (warp_leader) ptx::Barrier::arrive(&smem.empty[state.stage]);
    state.advance<Config::kStages>();
    if constexpr (!Config::kSwapAB) {
      promotion.apply(scales, partial, accumulator);
    } else {
      promotion.promote(k_block, partial, accumulator);
    }
  }
}

// Waits until only `kNewer` batches issued after `partial`'s remain in flight, hands its stage back
// and promotes the K block into `accumulator`. NOTE: the wait count is a compile-time constant at
// every call: with a run-time choice ptxas could not tell which registers were still being written
// and serialised every wgmma (its warning C7514).
template <int kNewer, class Config, class Promotion>
__device__ __forceinline__ void retire_promoted(const SharedStorage<Config>& smem, const Promotion& promotion,
                                                float (&accumulator)[Config::kTileN / 2],
                                                float (&partial)[Config::kTileN / 2], int stage,
                                                const typename Promotion::Loaded& scales) {
  cute::warpgroup_wait<kNewer>();
  #pragma unroll
  for (int i = 0; i < Config::kTileN / 2; ++i) cute::warpgroup_fence_operand(partial[i]);
  if (threadIdx.x % 32 == 0) ptx::Barrier::arrive(&smem.empty[stage]);
  promotion.apply(scales, partial, accumulator);
}

// FP8, two-consumer normal-orientation tiles (prefill): as consume_promoted, but block k + 1's wgmma
// is issued into a second partial before block k's is promoted, so each warpgroup keeps the tensor
// cores busy through its own promotion instead of draining them every K block. NOTE: the loop is
// unrolled by two so that each partial stays a register array with compile-time indices; three
// 64-float fragments fit the 232 registers the consumers get with setmaxnreg.
template <class Config, class Promotion>
__device__ void consume_promoted_overlapped(const SharedStorage<Config>& smem, PipelineState& state, int k_begin,
                                            int k_end, float (&accumulator)[Config::kTileN / 2],
                                            const Promotion& promotion) {
  constexpr int kFragment = Config::kTileN / 2;
  float partial_even[kFragment], partial_odd[kFragment];
  #pragma unroll
  for (int i = 0; i < kFragment; ++i) accumulator[i] = 0.0f;
  // Issues the next K block's batch into `partial` and returns its stage.
  const auto issue = [&](float (&partial)[kFragment]) {
    ptx::Barrier::wait(&smem.full[state.stage], state.phase);
    #pragma unroll
    for (int i = 0; i < kFragment; ++i) cute::warpgroup_fence_operand(partial[i]);
    cute::warpgroup_arrive();
    issue_stage<Config>(smem, state.stage, partial, false);
    cute::warpgroup_commit_batch();
    const int stage = state.stage;
    state.advance<Config::kStages>();
    return stage;
  };
  // Each block's scales are loaded when its batch is issued: their latency passes under the
  // retirement of the block before (a 128×128 tile's promotion waited on them, ncu: docs/PERF.md).
  using Loaded = typename Promotion::Loaded;
  int k_block = k_begin;
  Loaded even_scales = promotion.load(k_block);
  int even_stage = issue(partial_even);
  // partial_even holds block k_block in flight at the top of each round.
  for (; k_block + 2 < k_end; k_block += 2) {
    const Loaded odd_scales = promotion.load(k_block + 1);
    const int odd_stage = issue(partial_odd);
    retire_promoted<1>(smem, promotion, accumulator, partial_even, even_stage, even_scales);
    even_scales = promotion.load(k_block + 2);
    even_stage = issue(partial_even);
    retire_promoted<1>(smem, promotion, accumulator, partial_odd, odd_stage, odd_scales);
  }
  if (k_block + 1 < k_end) {
    const Loaded odd_scales = promotion.load(k_block + 1);
    const int odd_stage = issue(partial_odd);
    retire_promoted<1>(smem, promotion, accumulator, partial_even, even_stage, even_scales);
    retire_promoted<0>(smem, promotion, accumulator, partial_odd, odd_stage, odd_scales);
  } else {
    retire_promoted<0>(smem, promotion, accumulator, partial_even, even_stage, even_scales);
  }
}

// FP8, two-consumer normal tiles 256 weight rows wide (Config::kFp8Halves, prefill): each K block is
// multiplied in two halves of 128 weight rows, each into the one 64-float partial and promoted into
// its half of the 128-float accumulator before the next half is issued; the stage goes back after the
// second half. NOTE: the warpgroup drains the tensor core at each promotion (no second partial fits
// beside the accumulator), but the other consumer warpgroup's batch runs meanwhile; what the wider
// tile buys is a quarter fewer operand bytes from L2 per FLOP than 128×128 (48 KB a stage for 8.4
// MFLOP, against 32 KB for 4.2), L2 being the busiest unit of the 128×128 FP8 GEMMs (docs/PERF.md).
// NOTE: the scales of K block k + 1 are loaded while block k runs, a whole block before their
// promotion: loaded with their own half's batch, they held up some promotions (fp8-block prefill
// layers 0.7-1.0 % faster on an H100, docs/PERF.md, twenty-third session).
template <class Config, class Promotion>
__device__ void consume_promoted_halves(const SharedStorage<Config>& smem, PipelineState& state, int k_begin,
                                        int k_end, float (&accumulator)[Config::kTileN / 2],
                                        const Promotion& promotion) {
  constexpr int kPartial = Config::kTileN / 4;
  using Loaded = typename Promotion::Loaded;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  float partial[kPartial];
  #pragma unroll
  for (int i = 0; i < Config::kTileN / 2; ++i) accumulator[i] = 0.0f;
  Loaded next[2] = {promotion.load(k_begin, 0), promotion.load(k_begin, 1)};
  for (int k_block = k_begin; k_block < k_end; ++k_block) {
    const Loaded current[2] = {next[0], next[1]};
    ptx::Barrier::wait(&smem.full[state.stage], state.phase);
    #pragma unroll
    for (int part = 0; part < 2; ++part) {
      #pragma unroll
      for (int i = 0; i < kPartial; ++i) cute::warpgroup_fence_operand(partial[i]);
      cute::warpgroup_arrive();
      issue_stage<Config, Config::kTileN / 2>(smem, state.stage, partial, false, part * (Config::kTileN / 2));
      cute::warpgroup_commit_batch();
      if (part == 0) {
        // The last block loads its own scales again rather than branch (k_block + 1 may be k_end).
        const int next_block = min(k_block + 1, k_end - 1);
        next[0] = promotion.load(next_block, 0);
        next[1] = promotion.load(next_block, 1);
      }
      cute::warpgroup_wait<0>();
      #pragma unroll
      for (int i = 0; i < kPartial; ++i) cute::warpgroup_fence_operand(partial[i]);
      if (part == 1 && warp_leader) ptx::Barrier::arrive(&smem.empty[state.stage]);
      promotion.apply_half(current[part], partial, accumulator, part);
    }
    state.advance<Config::kStages>();
  }
}

}  // namespace hmoe::gemm
