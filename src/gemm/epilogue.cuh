// Fused GEMM epilogues, written straight from the wgmma accumulator fragment: SwiGLU for GEMM1,
// × routing weight for GEMM2. Each maps fragment (row, column) to (token row, weight row) by
// orientation; rows past the tile's expert and weight rows past N are never written.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "gemm/config.hpp"
#include "gemm/ptx.cuh"
#include "gemm/scheduler.cuh"
#include "quant/divide.hpp"
#include "quant/fp8.cuh"

namespace hmoe::gemm {

struct EpilogueArgs {
  void* out;
  int out_cols;
  int weight_rows;
  const float* row_weights;
  bool tma_store;   // Config::kTmaStore variants: the output's layout allows it (KernelArgs::out_map is set)
  float* out_scales;   // Config::kFusedRequant GEMM1: e4m3 output and its 1×128 group scales (GemmLaunch)
  bool ue8m0;
  float* out_amax;     // Config::kKeepsAmax GEMM1: raised to the largest |bf16 output| (GemmLaunch)
  const float* out_static_scale;   // per-tensor Config::kFusedRequant GEMM1: e4m3 output under this scale
};

// Config::kKeepsAmax, EpilogueArgs::out_amax set: the warp's largest |output| into *target. `amax` is the
// largest |value| of the fp32 values the thread rounded to bf16 and wrote; rounding is monotone and
// symmetric, so the bf16 rounding of it is the largest |bf16 value| — the amax quant::amax_kernel takes
// over the stored output (NaN is skipped by fmaxf in both). Every lane of the warp must call it.
__device__ __forceinline__ void publish_amax(float amax, float* target) {
  if (target == nullptr) return;
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  amax = __bfloat162float(__float2bfloat16_rn(amax));
  if (threadIdx.x % 32 == 0 && amax > 0.0f) quant::atomic_max_abs(target, amax);
}

// Where a kTmaStore variant's epilogue writes its staged tile: the output's TMA map and the CTA's
// shared-memory tile (SharedStorage::store_tile).
struct StoreTarget {
  const CUtensorMap* map;
  std::uint8_t* tile;
};

// NOTE: the approximate division (MUFU.RCP and a multiply, ≤ 2 ulp of fp32 before the bf16 rounding):
// with `/` every one of a 128×256 tile's 64 SwiGLUs a thread compiled to an IEEE division with its own
// slow-path branch and reconvergence region, which kept them from overlapping — ~8 k of a ~40 k-cycle
// GEMM1 item (trace, docs/PERF.md twenty-first session). x → −∞ gives x · rcp(∞) = −0, the limit.
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

// Config::kTmaStore, a whole tile: this consumer warpgroup writes its 64 rows of bf16 output into its
// part of the staged tile, in boxes of 64 columns (128 bytes a row) laid out with the 128-byte swizzle
// the output map expects, then one thread stores the boxes with TMA at (column0, the warpgroup's first
// row). `value(half, chunk, factor)` is the thread's two adjacent output values of fragment row half
// `half` (rows lane/4 and lane/4 + 8 of its warp's 16) in 16-byte chunk `chunk` (8 output columns, the
// thread's pair at 2·(lane%4)); `row_factor(row)` is read once per fragment row half, from the tile's row.
// NOTE: the swizzle (16-byte chunk c of row r at chunk c ^ r % 8) also keeps the fragment's writes free
// of bank conflicts: a warp's 8 rows land in 8 different chunks.
template <class Config, class RowFactor, class Value>
__device__ __forceinline__ void store_staged_tile(const StoreTarget& target, const WorkItem& item, int column0,
                                                  const RowFactor& row_factor, const Value& value) {
  constexpr int kBoxColumns = 64, kBoxBytes = 64 * kBoxColumns * 2;
  constexpr int kChunks = Config::kOutputColumns / 8;
  const int warpgroup = threadIdx.x / 128, lane = threadIdx.x % 32;
  const bool leader = threadIdx.x % 128 == 0;
  const int barrier = 2 + warpgroup;   // named barriers 2, 3: one per consumer warpgroup (split_k.cuh takes 1)
  std::uint8_t* tile = target.tile + warpgroup * (Config::kOutputColumns / kBoxColumns) * kBoxBytes;
  // The warpgroup's previous TMA store must have read the tile before it is overwritten.
  if (leader) ptx::tma_store_wait_read();
  ptx::named_barrier_sync(barrier, 128);
  #pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = 16 * (threadIdx.x / 32 % 4) + lane / 4 + 8 * half;   // within the warpgroup's 64 rows
    const float factor = row_factor(64 * warpgroup + row);
    #pragma unroll
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      const int box = chunk / 8;
      *reinterpret_cast<__nv_bfloat162*>(tile + box * kBoxBytes + row * 128 + (((chunk % 8) ^ (row % 8)) * 16) +
                                         4 * (lane % 4)) = value(half, chunk, factor);
    }
  }
  ptx::fence_async_shared();
  ptx::named_barrier_sync(barrier, 128);
  if (leader) {
    #pragma unroll
    for (int box = 0; box < Config::kOutputColumns / kBoxColumns; ++box)
      ptx::tma_store_2d(target.map, tile + box * kBoxBytes, column0 + box * kBoxColumns,
                        item.tokens.row_begin + 64 * warpgroup);
    ptx::tma_store_commit();
  }
}

template <class Config, EpilogueKind = Config::kEpilogue>
struct Epilogue;

template <class Config>
struct Epilogue<Config, EpilogueKind::kSwiGlu> {
  static constexpr bool kSwapAB = Config::kSwapAB;
  static constexpr int kWeightTile = Config::kWeightTile;

  static __device__ void apply(const float (&acc)[Config::kTileN / 2], const WorkItem& item,
                               const EpilogueArgs& args, const StoreTarget& target) {
    if constexpr (Config::kFusedRequant) {
      if ((Config::kQuant == QuantKind::kBlockScale ? args.out_scales : args.out_static_scale) != nullptr)
        return apply_requantized(acc, item, args, target);
    }
    auto* out = static_cast<__nv_bfloat16*>(args.out);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;   // warp counts across consumer warpgroups
    const int weight_row0 = item.weight_tile * kWeightTile;
    // Config::kKeepsAmax: the largest |value| this thread writes (published per warp at the end).
    float amax = 0.0f;
    const auto swiglu_pair = [&](float gate0, float up0, float gate1, float up1) {
      const float a = silu(gate0) * up0, b = silu(gate1) * up1;
      if constexpr (Config::kKeepsAmax) amax = fmaxf(amax, fmaxf(fabsf(a), fabsf(b)));
      return __floats2bfloat162_rn(a, b);
    };
    if constexpr (Config::kTmaStore) {
      // As GEMM2's (below): only whole tiles, whose rows and output columns are all this item's.
      if (args.tma_store && item.tokens.row_end - item.tokens.row_begin == Config::kTokenTile &&
          weight_row0 + kWeightTile <= args.weight_rows) {
        // Output chunk c (8 columns) is the SwiGLU of fragment column groups 2c (gate) and 2c + 1 (up).
        store_staged_tile<Config>(
            target, item, weight_row0 / 2, [](int) { return 1.0f; },
            [&](int half, int chunk, float) {
              const float* gate = &acc[4 * (2 * chunk) + 2 * half];
              const float* up = &acc[4 * (2 * chunk + 1) + 2 * half];
              return swiglu_pair(gate[0], up[0], gate[1], up[1]);
            });
        if constexpr (Config::kKeepsAmax) publish_amax(amax, args.out_amax);
        return;
      }
    }
    if constexpr (!kSwapAB) {
      // Columns 8j (gate) and 8j+8 (up) of the fragment are one SwiGLU pair.
      #pragma unroll
      for (int j = 0; j < Config::kTileN / 8; j += 2) {
        if (weight_row0 + 8 * j >= args.weight_rows) break;
        const int column = weight_row0 / 2 + 4 * j + 2 * (lane % 4);
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = item.tokens.row_begin + 16 * warp + lane / 4 + 8 * half;
          if (row >= item.tokens.row_end) continue;
          const float* gate = &acc[4 * j + 2 * half];
          const float* up = &acc[4 * (j + 1) + 2 * half];
          const __nv_bfloat162 value = swiglu_pair(gate[0], up[0], gate[1], up[1]);
          *reinterpret_cast<__nv_bfloat162*>(out + static_cast<long long>(row) * args.out_cols + column) = value;
        }
      }
    } else {
      // Fragment rows r (gate) and r+8 (up) of each 16-row group are one SwiGLU pair.
      if (weight_row0 + 16 * warp >= args.weight_rows) return;   // (the whole warp: it wrote nothing)
      const int column = weight_row0 / 2 + 8 * warp + lane / 4;
      #pragma unroll
      for (int j = 0; j < Config::kTileN / 8; ++j) {
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = item.tokens.row_begin + 8 * j + 2 * (lane % 4) + r;
          if (row >= item.tokens.row_end) continue;
          const float value = silu(acc[4 * j + r]) * acc[4 * j + 2 + r];
          if constexpr (Config::kKeepsAmax) amax = fmaxf(amax, fabsf(value));
          out[static_cast<long long>(row) * args.out_cols + column] = __float2bfloat16_rn(value);
        }
      }
    }
    if constexpr (Config::kKeepsAmax) publish_amax(amax, args.out_amax);
  }

  // Config::kFusedRequant, GemmLaunch::out_scales set: the tile's 128 output columns are one 1×128 group of
  // GEMM2's input. Per fragment row half, each thread rounds its 32 SwiGLU values to bf16 (as the stored
  // intermediate is), the row's quad shares the amax, and every value becomes e4m3(v / scale) — the bytes
  // and scales quant::launch_quantize_rows writes from the bf16 output (quant/fp8.cuh, quant/divide.hpp).
  // Per-tensor variants (GemmLaunch::out_static_scale set) divide by the static scale instead: no amax,
  // no scales written (GEMM2 reads the static scale itself).
  // Whole tiles go through the staged tile and one TMA box of 128 e4m3 columns × 64 rows a warpgroup
  // (the 128-byte swizzle, as store_staged_tile); partial ones store each pair of bytes directly.
  static __device__ void apply_requantized(const float (&acc)[Config::kTileN / 2], const WorkItem& item,
                                           const EpilogueArgs& args, const StoreTarget& target) {
    static_assert(Config::kTileN == 2 * kScaleGroup && !kSwapAB, "one 1×128 group of outputs a tile row");
    constexpr int kChunks = kScaleGroup / 8;   // 8 output columns a chunk, a pair of them a thread
    auto* out = static_cast<std::uint8_t*>(args.out);
    const int warpgroup = threadIdx.x / 128, lane = threadIdx.x % 32;
    const int group = item.weight_tile, groups = args.out_cols / kScaleGroup, column0 = group * kScaleGroup;
    const bool staged = Config::kTmaStore && args.tma_store && item.tokens.row_end - item.tokens.row_begin == Config::kTokenTile;
    const bool leader = threadIdx.x % 128 == 0;
    const int barrier = 2 + warpgroup;   // named barriers 2, 3, as store_staged_tile
    std::uint8_t* tile = target.tile + warpgroup * 64 * kTileRowBytes;
    constexpr bool kStatic = Config::kQuant == QuantKind::kEpilogueScale;
    [[maybe_unused]] quant::StaticDivisor static_divisor{};
    if constexpr (kStatic) static_divisor = quant::make_static_divisor(*args.out_static_scale);
    if (staged) {
      if (leader) ptx::tma_store_wait_read();
      ptx::named_barrier_sync(barrier, 128);
    }
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * (threadIdx.x / 32 % 4) + lane / 4 + 8 * half;   // within the warpgroup's 64 rows
      const int token_row = item.tokens.row_begin + 64 * warpgroup + row;
      float value[2 * kChunks];
      float amax = 0.0f;
      #pragma unroll
      for (int chunk = 0; chunk < kChunks; ++chunk) {
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float gate = acc[4 * (2 * chunk) + 2 * half + e], up = acc[4 * (2 * chunk + 1) + 2 * half + e];
          value[2 * chunk + e] = __bfloat162float(__float2bfloat16_rn(silu(gate) * up));
          amax = fmaxf(amax, fabsf(value[2 * chunk + e]));
        }
      }
      const bool row_valid = token_row < item.tokens.row_end;
      quant::Divisor divisor{};
      if constexpr (!kStatic) {
        // The row's 128 columns lie in the four lanes of its quad.
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        const float scale = quant::fp8_scale(amax, args.ue8m0);
        divisor = quant::make_divisor(scale);
        if (lane % 4 == 0 && row_valid) args.out_scales[static_cast<long long>(token_row) * groups + group] = scale;
      }
      if constexpr (kStatic) {
        quant::divide_static_rn(value, static_divisor);   // the row half's 32 values, one fallback branch
      } else {
        #pragma unroll
        for (int i = 0; i < 2 * kChunks; ++i) value[i] = quant::divide_rn(value[i], divisor);
      }
      #pragma unroll
      for (int chunk = 0; chunk < kChunks; ++chunk) {
        // x is the low byte: the pair's first column.
        const __nv_fp8x2_storage_t pair = __nv_cvt_float2_to_fp8x2(make_float2(value[2 * chunk], value[2 * chunk + 1]),
                                                                   __NV_SATFINITE, __NV_E4M3);
        const int byte = 8 * chunk + 2 * (lane % 4);   // the output column within the group
        if (staged) {
          *reinterpret_cast<__nv_fp8x2_storage_t*>(tile + row * kTileRowBytes + (((byte / 16) ^ (row % 8)) * 16) +
                                                   byte % 16) = pair;
        } else if (row_valid) {
          *reinterpret_cast<__nv_fp8x2_storage_t*>(out + static_cast<long long>(token_row) * args.out_cols + column0 +
                                                   byte) = pair;
        }
      }
    }
    if (staged) {
      ptx::fence_async_shared();
      ptx::named_barrier_sync(barrier, 128);
      if (leader) {
        ptx::tma_store_2d(target.map, tile, column0, item.tokens.row_begin + 64 * warpgroup);
        ptx::tma_store_commit();
      }
    }
  }
};

template <class Config>
struct Epilogue<Config, EpilogueKind::kRoutingWeight> {
  static constexpr bool kSwapAB = Config::kSwapAB;
  static constexpr int kWeightTile = Config::kWeightTile;

  static __device__ void apply(const float (&acc)[Config::kTileN / 2], const WorkItem& item,
                               const EpilogueArgs& args, const StoreTarget& target) {
    auto* out = static_cast<__nv_bfloat16*>(args.out);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;   // warp counts across consumer warpgroups
    const int weight_row0 = item.weight_tile * kWeightTile;
    if constexpr (Config::kTmaStore) {
      // Rows past the expert's belong to the next expert's tile, so only whole tiles go through TMA.
      if (args.tma_store && item.tokens.row_end - item.tokens.row_begin == Config::kTokenTile &&
          weight_row0 + kWeightTile <= args.weight_rows) {
        store_staged_tile<Config>(
            target, item, weight_row0, [&](int tile_row) { return args.row_weights[item.tokens.row_begin + tile_row]; },
            [&](int half, int chunk, float scale) {
              return __floats2bfloat162_rn(acc[4 * chunk + 2 * half] * scale, acc[4 * chunk + 2 * half + 1] * scale);
            });
        return;
      }
    }
    if constexpr (!kSwapAB) {
      #pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = item.tokens.row_begin + 16 * warp + lane / 4 + 8 * half;
        if (row >= item.tokens.row_end) continue;
        const float scale = args.row_weights[row];
        #pragma unroll
        for (int j = 0; j < Config::kTileN / 8; ++j) {
          const int column = weight_row0 + 8 * j + 2 * (lane % 4);
          if (column >= args.weight_rows) break;
          const __nv_bfloat162 value =
              __floats2bfloat162_rn(acc[4 * j + 2 * half] * scale, acc[4 * j + 2 * half + 1] * scale);
          *reinterpret_cast<__nv_bfloat162*>(out + static_cast<long long>(row) * args.out_cols + column) = value;
        }
      }
    } else {
      #pragma unroll
      for (int j = 0; j < Config::kTileN / 8; ++j) {
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = item.tokens.row_begin + 8 * j + 2 * (lane % 4) + r;
          if (row >= item.tokens.row_end) continue;
          const float scale = args.row_weights[row];
          #pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int column = weight_row0 + 16 * warp + lane / 4 + 8 * half;
            if (column >= args.weight_rows) continue;
            out[static_cast<long long>(row) * args.out_cols + column] =
                __float2bfloat16_rn(acc[4 * j + 2 * half + r] * scale);
          }
        }
      }
    }
  }
};

}  // namespace hmoe::gemm
