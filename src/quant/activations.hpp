// Dynamic (or static per-tensor) FP8 quantisation of activation rows: the layer input x as it is
// gathered into expert-sorted rows, and the SwiGLU output before GEMM2 (DESIGN.md §2).
#pragma once

#include <cuda_runtime_api.h>

#include "hmoe/hmoe.hpp"

namespace hmoe::quant {

struct ActivationRows {
  const void* source = nullptr;        // bf16 rows [*, cols]
  const int* source_row = nullptr;     // row r reads source row source_row[r] (nullptr: row r itself)
  const int* num_rows = nullptr;       // device count of rows to quantise (≤ max_rows)
  int max_rows = 0;                    // bound for the grid
  int cols = 0;
  // Per-tensor dynamic scales cover these source rows instead (x: all T tokens, not only the
  // gathered rows); 0 means the quantised rows themselves.
  int amax_rows = 0;
  // Per-tensor dynamic scales: scales[1] already holds the amax of the source rows (GEMM1 kept it:
  // gemm::GemmLaunch::out_amax), so no zeroing and no amax pass are enqueued.
  bool amax_ready = false;
  // Per-tensor dynamic scales: scales[1] was zeroed earlier on the stream (the permute stage does it:
  // permute::ZeroedSlots), so the amax pass runs without a memset before it.
  bool amax_zeroed = false;
  // Per-token scatter (prefill, permute::scatter_x_rows): when set, each of `tokens` source rows is
  // read once and its e4m3 row and scales are written to its top_k rows slot_rows[token·top_k + s]
  // (−1: an invalid id, no row); source_row and num_rows are then unused. The bytes are the same as
  // the per-row walk's: a row's e4m3 values and scales depend only on its source row.
  const int* slot_rows = nullptr;
  int top_k = 0;
  int tokens = 0;
  // Per-token scatter only: each token's e4m3 row goes once to row `token` (x in token order, for a GEMM1
  // that gathers its rows through the row → token index), its scales still to each of its top_k rows
  // (the GEMMs read scales by expert-sorted row).
  bool values_by_token = false;
};

// Writes e4m3 rows [max_rows, cols] to values (rows ≥ *num_rows untouched) and the scales the GEMM
// reads: per 1×128 group [rows, cols/128] (fp8-block), per row [rows] (fp8-channel), or for
// fp8-tensor scales[0] = the scale (static_scale when given, else from the amax kept in scales[1]).
// Enqueues 1 kernel (3 launches for dynamic per-tensor: zero, amax, quantise; 2 with amax_zeroed; 1
// with amax_ready); pdl as in common/launch.cuh. Throws, before enqueueing anything, for a per-row walk
// without num_rows or values_by_token without slot_rows.
void launch_quantize_rows(const MoeSpec& spec, const ActivationRows& rows, const float* static_scale, void* values,
                          float* scales, cudaStream_t stream, bool pdl = false);

// Loads the kernels (module loading is lazy), so the first run costs what later runs do.
void prepare();

}  // namespace hmoe::quant
