// Device side of the expert-parallel dispatch: the plan of dispatch_plan.hpp built on the GPU
// (bit-identical to plan_dispatch), packing x rows into the send buffer (bf16, or e4m3 with 1×128
// scales) and unpacking received e4m3 rows back to bf16. No host synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace hmoe::ep {

struct DispatchBuffers {
  int* chunk_bases = nullptr;      // [plan_chunks(T·k), R]
  int* send_counts = nullptr;      // [R]
  int* valid_rows = nullptr;       // [1]: Σ send_counts
  int* pair_rows = nullptr;        // [T·k]
  int* send_tokens = nullptr;      // [T·k]
  std::int32_t* send_ids = nullptr;  // [T·k]: local expert id of each send row
  float* send_weights = nullptr;   // [T·k]
};

// Three launches (count per chunk, scan, place). Rows in [*valid_rows, T·k) of the send arrays
// are left untouched. invalid_id_count (optional) gains the pairs with an id outside [0, E).
// num_tokens = 0 only zeroes send_counts and valid_rows.
void launch_dispatch_plan(const std::int32_t* topk_ids, const float* topk_weights, int num_tokens, int top_k,
                          int num_experts, int world_size, const DispatchBuffers& buffers, int* invalid_id_count,
                          cudaStream_t stream);

// send_rows[r] = x[send_tokens[r]] for r < *valid_rows (bf16, H % 8 == 0). max_rows bounds the grid.
void launch_pack_rows(const void* x, const int* send_tokens, const int* valid_rows, int max_rows, int hidden,
                      void* send_rows, cudaStream_t stream);

// The same rows quantised: e4m3 [rows, H] and fp32 scales [rows, H/128], per 1×128 group
// scale = amax / 448 (UE8M0: rounded up to a power of two; an all-zero group: 1),
// value = e4m3(v / scale) — the fp8-block activation rule of quant/activations.hpp, reused.
void launch_pack_rows_fp8(const void* x, const int* send_tokens, const int* valid_rows, int max_rows, int hidden,
                          bool ue8m0, void* send_rows, float* send_scales, cudaStream_t stream);

// bf16 rows [rows, H] = e4m3 value × its group's scale, rounded to nearest even (rows is a host count).
void launch_unpack_fp8_rows(const void* fp8_rows, const float* scales, int rows, int hidden, void* bf16_rows,
                            cudaStream_t stream);

// Loads the kernels (module loading is lazy), so the first run costs what later runs do.
void prepare_dispatch_kernels();

}  // namespace hmoe::ep
