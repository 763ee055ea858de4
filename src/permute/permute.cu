// Counting sort of (token, slot) pairs by expert. Counts and positions use atomics: the order of
// rows inside one expert may differ between runs, but every row is computed independently and the
// combine sums each token's slots in slot order, so outputs are bit-identical run to run.

#include "common/cuda_check.hpp"
#include "common/environment.hpp"
#include "common/launch.cuh"
#include "permute/permute.hpp"
#include "permute/single_block.cuh"

namespace hmoe::permute {
namespace {

__global__ void count_experts_kernel(const int* __restrict__ topk_ids, int entries, int experts,
                                     int* __restrict__ expert_counts, int* __restrict__ invalid_id_count) {
  pdl_start();
  extern __shared__ int block_counts[];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) block_counts[e] = 0;
  __syncthreads();
  int invalid = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < entries; i += gridDim.x * blockDim.x) {
    const int expert = topk_ids[i];
    if (expert >= 0 && expert < experts)
      atomicAdd(&block_counts[expert], 1);
    else
      ++invalid;
  }
  if (invalid != 0 && invalid_id_count != nullptr) atomicAdd(invalid_id_count, invalid);
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x)
    if (block_counts[e] != 0) atomicAdd(&expert_counts[e], block_counts[e]);
}

__global__ void __launch_bounds__(kScanThreads) build_work_list_kernel(
    const int* __restrict__ expert_counts, int experts, int token_tile, int* __restrict__ expert_cursor,
    int* __restrict__ expert_offsets, int* __restrict__ num_tiles, TokenTile* __restrict__ tiles,
    ZeroedSlots zeroed) {
  pdl_start();
  zero_slots(zeroed);
  const int e = threadIdx.x;
  const int row_offset =
      plan_tiles(e < experts ? expert_counts[e] : 0, experts, token_tile, expert_offsets, num_tiles, tiles);
  if (e < experts) expert_cursor[e] = row_offset;
}

// The whole permute stage in one block, for few (token, slot) pairs: at decode sizes the stage is
// launch-bound, and one launch replaces four (memset, count, work list, row assignment).
__global__ void __launch_bounds__(kScanThreads) permute_single_block_kernel(
    const int* __restrict__ topk_ids, const float* __restrict__ topk_weights, int entries, int top_k, int experts,
    int token_tile, int* __restrict__ expert_offsets, int* __restrict__ num_tiles, TokenTile* __restrict__ tiles,
    int* __restrict__ slot_rows, float* __restrict__ row_weights, int* __restrict__ sorted_tokens,
    int* __restrict__ invalid_id_count, ZeroedSlots zeroed) {
  pdl_start();
  permute_block(topk_ids, topk_weights, entries, top_k, experts, token_tile, expert_offsets, num_tiles, tiles,
                slot_rows, row_weights, sorted_tokens, invalid_id_count, zeroed);
}

// One thread per (token, slot): claim a row of its expert and record which token fills it.
__global__ void assign_rows_kernel(const int* __restrict__ topk_ids, const float* __restrict__ topk_weights,
                                   int entries, int top_k, int experts, int* __restrict__ expert_cursor,
                                   int* __restrict__ slot_rows, float* __restrict__ row_weights,
                                   int* __restrict__ sorted_tokens) {
  pdl_start();
  const int entry = blockIdx.x * blockDim.x + threadIdx.x;
  if (entry >= entries) return;
  const int expert = topk_ids[entry];
  if (expert < 0 || expert >= experts) {
    slot_rows[entry] = -1;
    return;
  }
  const int row = atomicAdd(&expert_cursor[expert], 1);
  slot_rows[entry] = row;
  row_weights[row] = topk_weights[entry];
  sorted_tokens[row] = entry / top_k;
}

// One warp per expert-sorted row: copy the x row of the token that fills it (16-byte vectors).
__global__ void gather_rows_kernel(const uint4* __restrict__ x, const int* __restrict__ sorted_tokens,
                                   const int* __restrict__ expert_offsets, int experts, int vectors_per_row,
                                   uint4* __restrict__ sorted_x) {
  pdl_start();
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= expert_offsets[experts]) return;   // rows past the valid (token, slot) pairs
  const uint4* source = x + static_cast<long long>(sorted_tokens[row]) * vectors_per_row;
  uint4* destination = sorted_x + static_cast<long long>(row) * vectors_per_row;
  for (int v = lane; v < vectors_per_row; v += 32) destination[v] = source[v];
}

// Per token (prefill): one warp per (token, kScatterVectors-vector chunk of its x row) loads the chunk
// once and stores it into each of the token's sorted rows (slot_rows; −1: an invalid id, no row).
constexpr int kScatterVectorsPerLane = 4;
constexpr int kScatterVectors = 32 * kScatterVectorsPerLane;
__global__ void scatter_rows_kernel(const uint4* __restrict__ x, const int* __restrict__ slot_rows, int num_tokens,
                                    int top_k, int vectors_per_row, uint4* __restrict__ sorted_x) {
  pdl_start();
  const int chunks = (vectors_per_row + kScatterVectors - 1) / kScatterVectors;
  const long long warp = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) / 32;
  if (warp >= static_cast<long long>(num_tokens) * chunks) return;
  const int token = static_cast<int>(warp / chunks);
  const int first = static_cast<int>(warp % chunks) * kScatterVectors + threadIdx.x % 32;
  const uint4* source = x + static_cast<long long>(token) * vectors_per_row;
  uint4 chunk[kScatterVectorsPerLane];
  #pragma unroll
  for (int j = 0; j < kScatterVectorsPerLane; ++j)
    if (first + 32 * j < vectors_per_row) chunk[j] = source[first + 32 * j];
  for (int s = 0; s < top_k; ++s) {
    const int row = slot_rows[static_cast<long long>(token) * top_k + s];
    if (row < 0) continue;
    uint4* destination = sorted_x + static_cast<long long>(row) * vectors_per_row;
    #pragma unroll
    for (int j = 0; j < kScatterVectorsPerLane; ++j)
      if (first + 32 * j < vectors_per_row) destination[first + 32 * j] = chunk[j];
  }
}

}  // namespace

bool scatter_x_environment() {
  return environment_switch_on("HMOE_SCATTER_X");
}

void launch_permute(const int* topk_ids, const float* topk_weights, const void* x, int num_tokens, int top_k,
                    int experts, int hidden, int token_tile, GatherX gather, const PermuteBuffers& buffers,
                    int* invalid_id_count, cudaStream_t stream, bool pdl) {
  if (experts > kScanThreads) throw Error("hmoe: permute supports at most 1024 experts");
  const int entries = num_tokens * top_k;
  if (entries <= kSingleBlockEntries) {
    launch_kernel(pdl, permute_single_block_kernel, 1, kScanThreads, 0, stream,
        topk_ids, topk_weights, entries, top_k, experts, token_tile, buffers.expert_offsets, buffers.num_tiles,
        buffers.tiles, buffers.slot_rows, buffers.row_weights, buffers.sorted_tokens, invalid_id_count,
        buffers.zeroed);
  } else {
    // Of the stage's own counters only expert_counts needs zeroing (the others are written whole); the
    // work-list kernel zeroes buffers.zeroed.
    HMOE_CUDA_CHECK(cudaMemsetAsync(buffers.expert_counts, 0, sizeof(int) * experts, stream));
    const int count_blocks = std::min((entries + 255) / 256, 264);
    launch_kernel(pdl, count_experts_kernel, count_blocks, 256, sizeof(int) * experts, stream,
        topk_ids, entries, experts, buffers.expert_counts, invalid_id_count);
    launch_kernel(pdl, build_work_list_kernel, 1, kScanThreads, 0, stream, buffers.expert_counts, experts, token_tile,
                                                           buffers.expert_cursor, buffers.expert_offsets,
                                                           buffers.num_tiles, buffers.tiles, buffers.zeroed);
    launch_kernel(pdl, assign_rows_kernel, (entries + 255) / 256, 256, 0, stream, topk_ids, topk_weights, entries, top_k, experts,
                                                                   buffers.expert_cursor, buffers.slot_rows,
                                                                   buffers.row_weights, buffers.sorted_tokens);
  }
  constexpr int kWarpsPerBlock = 8;
  if (gather == GatherX::kPerToken) {
    const int vectors = hidden / 8;
    const long long warps = static_cast<long long>(num_tokens) * ((vectors + kScatterVectors - 1) / kScatterVectors);
    launch_kernel(pdl, scatter_rows_kernel, static_cast<int>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  kWarpsPerBlock * 32, 0, stream, static_cast<const uint4*>(x), buffers.slot_rows, num_tokens, top_k,
                  vectors, static_cast<uint4*>(buffers.sorted_x));
    return;
  }
  if (gather != GatherX::kPerRow) return;
  launch_kernel(pdl, gather_rows_kernel, (entries + kWarpsPerBlock - 1) / kWarpsPerBlock, kWarpsPerBlock * 32, 0, stream,
      static_cast<const uint4*>(x), buffers.sorted_tokens, buffers.expert_offsets, experts, hidden / 8,
      static_cast<uint4*>(buffers.sorted_x));
}

void prepare() {
  cudaFuncAttributes attributes;
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, permute_single_block_kernel));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, count_experts_kernel));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, build_work_list_kernel));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, assign_rows_kernel));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, gather_rows_kernel));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, scatter_rows_kernel));
}

}  // namespace hmoe::permute
