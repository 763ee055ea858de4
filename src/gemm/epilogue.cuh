// Fused GEMM epilogues, written straight from the wgmma accumulator fragment: SwiGLU for GEMM1,
// × routing weight for GEMM2. Each maps fragment (row, column) to (token row, weight row) by
// orientation; rows past the tile's expert and weight rows past N are never written.
#pragma once

#include <cuda_bf16.h>

#include "gemm/config.hpp"
#include "gemm/scheduler.cuh"

namespace hmoe::gemm {

struct EpilogueArgs {
  void* out;
  int out_cols;
  int weight_rows;
  const float* row_weights;
};

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

template <class Config, EpilogueKind = Config::kEpilogue>
struct Epilogue;

template <class Config>
struct Epilogue<Config, EpilogueKind::kSwiGlu> {
  static constexpr bool kSwapAB = Config::kSwapAB;
  static constexpr int kWeightTile = Config::kWeightTile;

  static __device__ void apply(const float (&acc)[Config::kTileN / 2], const WorkItem& item,
                               const EpilogueArgs& args) {
    auto* out = static_cast<__nv_bfloat16*>(args.out);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;   // warp counts across consumer warpgroups
    const int weight_row0 = item.weight_tile * kWeightTile;
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
          const __nv_bfloat162 value = __floats2bfloat162_rn(silu(gate[0]) * up[0], silu(gate[1]) * up[1]);
          *reinterpret_cast<__nv_bfloat162*>(out + static_cast<long long>(row) * args.out_cols + column) = value;
        }
      }
    } else {
      // Fragment rows r (gate) and r+8 (up) of each 16-row group are one SwiGLU pair.
      if (weight_row0 + 16 * warp >= args.weight_rows) return;
      const int column = weight_row0 / 2 + 8 * warp + lane / 4;
      #pragma unroll
      for (int j = 0; j < Config::kTileN / 8; ++j) {
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = item.tokens.row_begin + 8 * j + 2 * (lane % 4) + r;
          if (row >= item.tokens.row_end) continue;
          out[static_cast<long long>(row) * args.out_cols + column] =
              __float2bfloat16_rn(silu(acc[4 * j + r]) * acc[4 * j + 2 + r]);
        }
      }
    }
  }
};

template <class Config>
struct Epilogue<Config, EpilogueKind::kRoutingWeight> {
  static constexpr bool kSwapAB = Config::kSwapAB;
  static constexpr int kWeightTile = Config::kWeightTile;

  static __device__ void apply(const float (&acc)[Config::kTileN / 2], const WorkItem& item,
                               const EpilogueArgs& args) {
    auto* out = static_cast<__nv_bfloat16*>(args.out);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;   // warp counts across consumer warpgroups
    const int weight_row0 = item.weight_tile * kWeightTile;
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
