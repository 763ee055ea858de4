// FP8 dequantisation inside the expert GEMMs: which weight and token scale each element of the
// wgmma accumulator fragment takes, for both orientations and both ways scales are applied
// (once in the epilogue, or per 128-wide K block).
#pragma once

#include "gemm/config.hpp"
#include "gemm/scheduler.cuh"

namespace hmoe::gemm {

struct ScaleArgs {
  const float* weight_scale;   // GemmLaunch::weight_scale
  const float* token_scale;    // GemmLaunch::token_scale
  bool per_row;                // kEpilogueScale: per-channel × per-token (else per-tensor)
  int weight_rows;             // N per expert
  int k_groups;                // K / 128 (block scales)
};

// Row of the checkpoint's weight matrix that prepared row `row` holds: GEMM1's w13 is regrouped by
// 16 rows (prepare.cu), GEMM2's w2 is not.
template <EpilogueKind kEpilogue>
__device__ __forceinline__ int source_weight_row(int row, int weight_rows) {
  if constexpr (kEpilogue == EpilogueKind::kSwiGlu) {
    return swiglu_source_row(row, weight_rows / 2);
  } else {
    return row;
  }
}

// Fragment element 4j + r of this thread: its row (WGMMA M side, counted across the consumer
// warpgroups) and column (N side); see consume() in mainloop.cuh.
__device__ __forceinline__ int fragment_row(int r) { return 16 * (threadIdx.x / 32) + (threadIdx.x % 32) / 4 + 8 * (r / 2); }
__device__ __forceinline__ int fragment_column(int j, int r) { return 8 * j + 2 * (threadIdx.x % 4) + r % 2; }

// kEpilogueScale: multiplies the finished accumulator by weight scale × token scale, per element.
template <class Config>
__device__ __forceinline__ void apply_epilogue_scales(float (&acc)[Config::kTileN / 2], const WorkItem& item,
                                                      const ScaleArgs& args) {
  constexpr int kFragment = Config::kTileN / 2;
  const int expert = item.tokens.expert;
  if (!args.per_row) {
    const float scale = args.weight_scale[expert] * args.token_scale[0];
    #pragma unroll
    for (int i = 0; i < kFragment; ++i) acc[i] *= scale;
    return;
  }
  const float* weight_scale = args.weight_scale + static_cast<long long>(expert) * args.weight_rows;
  const int weight_row0 = item.weight_tile * Config::kWeightTile;
  const int last_token = item.tokens.row_end - 1;
  const auto token_factor = [&](int tile_row) {
    return args.token_scale[min(item.tokens.row_begin + tile_row, last_token)];
  };
  if constexpr (!Config::kSwapAB) {
    // Tokens on rows (two a thread), weight rows on columns (8j + q of the tile, q = 2·(lane%4) + c).
    // GEMM1's prepared rows come in 16-row groups of 8 gate rows, then the 8 up rows of the same
    // columns (tiles start on a group), so column 8j + q is checkpoint row weight_row0/2 + 8·(j/2) + q,
    // plus I for odd j: one base pointer per SwiGLU half and compile-time offsets. NOTE: with an
    // index clamped per column, a 256-wide tile held 64 addresses and spilled; columns past N
    // (never written) take 0 instead of reading past the expert's scales.
    const int lane_column = 2 * (threadIdx.x % 4);
    const float* base[2];
    if constexpr (Config::kEpilogue == EpilogueKind::kSwiGlu) {
      base[0] = weight_scale + weight_row0 / 2 + lane_column;
      base[1] = base[0] + args.weight_rows / 2;
    } else {
      base[0] = base[1] = weight_scale + weight_row0 + lane_column;
    }
    const float token[2] = {token_factor(fragment_row(0)), token_factor(fragment_row(2))};
    #pragma unroll
    for (int j = 0; j < kFragment / 4; ++j) {
      #pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int offset = Config::kEpilogue == EpilogueKind::kSwiGlu ? 8 * (j / 2) + c : 8 * j + c;
        const float weight = weight_row0 + lane_column + 8 * j + c < args.weight_rows ? base[j % 2][offset] : 0.0f;
        acc[4 * j + c] *= token[0] * weight;
        acc[4 * j + 2 + c] *= token[1] * weight;
      }
    }
  } else {
    const auto weight_factor = [&](int tile_row) {
      const int row = min(weight_row0 + tile_row, args.weight_rows - 1);   // rows past N are never written
      return weight_scale[source_weight_row<Config::kEpilogue>(row, args.weight_rows)];
    };
    #pragma unroll
    for (int j = 0; j < kFragment / 4; ++j) {
      #pragma unroll
      for (int r = 0; r < 4; ++r)
        acc[4 * j + r] *= weight_factor(fragment_row(r)) * token_factor(fragment_column(j, r));
    }
  }
}

// kEpilogueScale: the K blocks are promoted unscaled (the scales come once, in the epilogue).
// NOTE: Hopper's e4m3 wgmma accumulates with ~14 bits of mantissa (DeepSeek-V3 report, §3.3.2):
// summed over all of K = 7168 in the tensor core the error reached 2.5% against the reference,
// promoted into fp32 registers every 128 K it stays below 1%.
template <class Config>
struct PlainPromotion {
  struct Loaded {};   // no per-block scales
  __device__ __forceinline__ Loaded load(int, int = 0) const { return {}; }
  __device__ __forceinline__ void apply(const Loaded& loaded, const float (&partial)[Config::kTileN / 2],
                                        float (&accumulator)[Config::kTileN / 2]) const {
    apply_half(loaded, partial, accumulator, 0);
  }
  // Adds a partial of kPartial floats into the accumulator from fragment element kPartial · part on
  // (Config::kFp8Halves: each 128-row weight half of the tile is a partial of its own).
  template <int kPartial>
  __device__ __forceinline__ void apply_half(const Loaded&, const float (&partial)[kPartial],
                                             float (&accumulator)[Config::kTileN / 2], int part) const {
    #pragma unroll
    for (int i = 0; i < kPartial; ++i) accumulator[kPartial * part + i] += partial[i];
  }
  __device__ __forceinline__ void promote(int k_block, const float (&partial)[Config::kTileN / 2],
                                          float (&accumulator)[Config::kTileN / 2]) const {
    apply(load(k_block), partial, accumulator);
  }
};

// kBlockScale: the scales of one work item. Each 128-row weight half of a tile (the whole tile
// when it has at most 128 rows) falls in at most two 128-row blocks, one per SwiGLU half (gate rows,
// up rows; the same block for w2), since tiles are aligned and I is a multiple of 128 for this
// scheme; GEMM1's 256-row tiles hold the gate and up rows of 128 intermediate columns, so both of
// their halves take the same two blocks.
template <class Config>
class BlockScales {
  static constexpr int kHalves = Config::kFp8Halves ? 2 : 1;   // 128-row weight halves of the tile

 public:
  __device__ BlockScales(const WorkItem& item, const ScaleArgs& args) : args_(args) {
    const int weight_row0 = item.weight_tile * Config::kWeightTile;
    const int blocks_per_expert = (args.weight_rows + kScaleGroup - 1) / kScaleGroup;
    const long long expert_base = static_cast<long long>(item.tokens.expert) * blocks_per_expert;
    // Rows 0..7 of every 16-row group are gate rows of w13, rows 8..15 up rows. NOTE: a weight half
    // past N (N a multiple of 128, not of 256) takes N's last block; its columns are never written.
    #pragma unroll
    for (int part = 0; part < kHalves; ++part) {
      #pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = min(weight_row0 + kScaleGroup * part + 8 * half, args.weight_rows - 1);
        weight_blocks_[part][half] =
            args.weight_scale +
            (expert_base + source_weight_row<Config::kEpilogue>(row, args.weight_rows) / kScaleGroup) * args.k_groups;
      }
    }
    row_begin_ = item.tokens.row_begin;
    last_token_ = item.tokens.row_end - 1;
  }

  // Normal orientation: the four scales of one K block this thread's fragment takes (tokens on
  // rows, two a thread; weights on columns, 8-column groups alternating gate/up) in weight half
  // `part`, loaded ahead of the block's promotion (the consumer loops load them when they issue
  // the block).
  struct Loaded {
    float weight[2];   // gate, up block
    float token[2];    // the thread's two fragment rows
  };
  __device__ __forceinline__ Loaded load(int k_block, int part = 0) const {
    static_assert(!Config::kSwapAB, "Swap-AB tiles take one token scale per fragment column: promote()");
    Loaded loaded;
    loaded.weight[0] = weight_blocks_[part][0][k_block];
    loaded.weight[1] = weight_blocks_[part][1][k_block];
    #pragma unroll
    for (int h = 0; h < 2; ++h) loaded.token[h] = token_scale(fragment_row(2 * h), k_block);
    return loaded;
  }
  __device__ __forceinline__ void apply(const Loaded& loaded, const float (&partial)[Config::kTileN / 2],
                                        float (&accumulator)[Config::kTileN / 2]) const {
    apply_half(loaded, partial, accumulator, 0);
  }
  // Adds a partial of kPartial floats (fragment groups of 8 columns, alternating gate/up: kPartial is
  // a multiple of 8) into the accumulator from fragment element kPartial · part on.
  template <int kPartial>
  __device__ __forceinline__ void apply_half(const Loaded& loaded, const float (&partial)[kPartial],
                                             float (&accumulator)[Config::kTileN / 2], int part) const {
    static_assert(kPartial % 8 == 0, "each partial starts on a gate group");
    float factor[2][2];   // [gate/up][fragment row half]
    #pragma unroll
    for (int g = 0; g < 2; ++g) {
      #pragma unroll
      for (int h = 0; h < 2; ++h) factor[g][h] = loaded.weight[g] * loaded.token[h];
    }
    #pragma unroll
    for (int j = 0; j < kPartial / 4; ++j) {
      #pragma unroll
      for (int r = 0; r < 4; ++r) accumulator[kPartial * part + 4 * j + r] += partial[4 * j + r] * factor[j % 2][r / 2];
    }
  }

  // accumulator += partial × weight scale × token scale, for K block k_block.
  __device__ __forceinline__ void promote(int k_block, const float (&partial)[Config::kTileN / 2],
                                          float (&accumulator)[Config::kTileN / 2]) const {
    if constexpr (!Config::kSwapAB) {
      apply(load(k_block), partial, accumulator);
    } else {
      // Weights on rows (gate row, then the up row 8 below), tokens on columns.
      const float weight_gate = weight_blocks_[0][0][k_block], weight_up = weight_blocks_[0][1][k_block];
      #pragma unroll
      for (int j = 0; j < Config::kTileN / 8; ++j) {
        const float token[2] = {token_scale(fragment_column(j, 0), k_block), token_scale(fragment_column(j, 1), k_block)};
        #pragma unroll
        for (int r = 0; r < 4; ++r)
          accumulator[4 * j + r] += partial[4 * j + r] * ((r < 2 ? weight_gate : weight_up) * token[r % 2]);
      }
    }
  }

 private:
  __device__ __forceinline__ float token_scale(int tile_row, int k_block) const {
    const int row = min(row_begin_ + tile_row, last_token_);   // padded rows are never written
    return args_.token_scale[static_cast<long long>(row) * args_.k_groups + k_block];
  }

  ScaleArgs args_;
  const float* weight_blocks_[kHalves][2];   // [weight half][gate, up]: the block's K-group scales
  int row_begin_ = 0;
  int last_token_ = 0;
};

}  // namespace hmoe::gemm
