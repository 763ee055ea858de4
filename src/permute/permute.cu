// Counting sort of (token, slot) pairs by expert. Counts and positions use atomics: the order of
// rows inside one expert may differ between runs, but every row is computed independently and the
// combine sums each token's slots in slot order, so outputs are bit-identical run to run.
#include <cub/block/block_scan.cuh>

#include "common/cuda_check.hpp"
#include "permute/permute.hpp"

namespace hmoe::permute {
namespace {

constexpr int kScanThreads = 1024;

__global__ void count_experts_kernel(const int* __restrict__ topk_ids, int entries, int experts,
                                     int* __restrict__ expert_counts, int* __restrict__ invalid_id_count) {
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

// One block: expert offsets (exclusive scan of counts), then the tile list, filled cooperatively
// so that one expert holding every token does not serialise on one thread.
__global__ void __launch_bounds__(kScanThreads) build_work_list_kernel(
    const int* __restrict__ expert_counts, int experts, int token_tile, int* __restrict__ expert_cursor,
    int* __restrict__ expert_offsets, int* __restrict__ num_tiles, TokenTile* __restrict__ tiles) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int tile_offsets[kScanThreads + 1];
  __shared__ int row_offsets[kScanThreads + 1];
  const int e = threadIdx.x;
  const int count = e < experts ? expert_counts[e] : 0;
  int row_offset = 0, total_rows = 0;
  Scan(scan_storage).ExclusiveSum(count, row_offset, total_rows);
  __syncthreads();
  const int expert_tiles = (count + token_tile - 1) / token_tile;
  int tile_offset = 0, total_tiles = 0;
  Scan(scan_storage).ExclusiveSum(expert_tiles, tile_offset, total_tiles);
  row_offsets[e] = row_offset;
  tile_offsets[e] = tile_offset;
  if (e == 0) {
    row_offsets[kScanThreads] = total_rows;
    tile_offsets[kScanThreads] = total_tiles;
    *num_tiles = total_tiles;
  }
  if (e < experts) {
    expert_offsets[e] = row_offset;
    expert_cursor[e] = row_offset;
  }
  if (e == 0) expert_offsets[experts] = total_rows;
  __syncthreads();
  for (int tile = threadIdx.x; tile < total_tiles; tile += blockDim.x) {
    // The expert owning this tile: the last e with tile_offsets[e] <= tile (binary search).
    int low = 0, high = experts - 1;
    while (low < high) {
      const int mid = (low + high + 1) / 2;
      if (tile_offsets[mid] <= tile) low = mid; else high = mid - 1;
    }
    const int expert_end = low + 1 < experts ? row_offsets[low + 1] : total_rows;
    const int begin = row_offsets[low] + (tile - tile_offsets[low]) * token_tile;
    tiles[tile] = TokenTile{low, begin, min(begin + token_tile, expert_end), 0};
  }
}

// One warp per (token, slot): claim a row of its expert, then copy the token's x row there.
__global__ void scatter_rows_kernel(const int* __restrict__ topk_ids, const float* __restrict__ topk_weights,
                                    const uint4* __restrict__ x, int entries, int top_k, int experts,
                                    int vectors_per_row, int* __restrict__ expert_cursor,
                                    int* __restrict__ slot_rows, float* __restrict__ row_weights,
                                    uint4* __restrict__ sorted_x) {
  const int entry = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (entry >= entries) return;
  const int expert = topk_ids[entry];
  const bool valid = expert >= 0 && expert < experts;
  int row = -1;
  if (lane == 0 && valid) row = atomicAdd(&expert_cursor[expert], 1);
  row = __shfl_sync(0xffffffffu, row, 0);
  if (lane == 0) {
    slot_rows[entry] = row;
    if (valid) row_weights[row] = topk_weights[entry];
  }
  if (!valid) return;
  const uint4* source = x + static_cast<long long>(entry / top_k) * vectors_per_row;
  uint4* destination = sorted_x + static_cast<long long>(row) * vectors_per_row;
  for (int v = lane; v < vectors_per_row; v += 32) destination[v] = source[v];
}

}  // namespace

void launch_permute(const int* topk_ids, const float* topk_weights, const void* x, int num_tokens, int top_k,
                    int experts, int hidden, int token_tile, const PermuteBuffers& buffers,
                    int* invalid_id_count, cudaStream_t stream) {
  if (experts > kScanThreads) throw Error("hmoe: permute supports at most 1024 experts");
  const int entries = num_tokens * top_k;
  // expert_counts is the first of the counters; only it needs zeroing (the others are written).
  HMOE_CUDA_CHECK(cudaMemsetAsync(buffers.expert_counts, 0, sizeof(int) * experts, stream));
  const int count_blocks = std::min((entries + 255) / 256, 264);
  count_experts_kernel<<<count_blocks, 256, sizeof(int) * experts, stream>>>(topk_ids, entries, experts,
                                                                             buffers.expert_counts, invalid_id_count);
  HMOE_CUDA_CHECK(cudaGetLastError());
  build_work_list_kernel<<<1, kScanThreads, 0, stream>>>(buffers.expert_counts, experts, token_tile,
                                                         buffers.expert_cursor, buffers.expert_offsets,
                                                         buffers.num_tiles, buffers.tiles);
  HMOE_CUDA_CHECK(cudaGetLastError());
  const int warps_per_block = 8;
  scatter_rows_kernel<<<(entries + warps_per_block - 1) / warps_per_block, warps_per_block * 32, 0, stream>>>(
      topk_ids, topk_weights, static_cast<const uint4*>(x), entries, top_k, experts, hidden / 8,
      buffers.expert_cursor, buffers.slot_rows, buffers.row_weights, static_cast<uint4*>(buffers.sorted_x));
  HMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hmoe::permute
