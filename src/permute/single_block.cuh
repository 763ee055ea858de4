// The permute stage's single-block pieces, shared by permute.cu and the fused decode kernel
// (route_permute.cu): the work-list planning and the whole stage in one block of kScanThreads.
#pragma once

#include <cub/block/block_scan.cuh>

#include "permute/permute.hpp"
#include "permute/work_list.hpp"

namespace hmoe::permute {
namespace {

constexpr int kScanThreads = 1024;

// Called by all kScanThreads threads of one block, thread e holding expert e's token count:
// expert offsets (exclusive scan of the counts), then the tile list, filled cooperatively so that
// one expert holding every token does not serialise on one thread. Returns expert e's first row.
__device__ int plan_tiles(int count, int experts, int token_tile, int* __restrict__ expert_offsets,
                          int* __restrict__ num_tiles, TokenTile* __restrict__ tiles) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int tile_offsets[kScanThreads];
  __shared__ int row_offsets[kScanThreads];
  const int e = threadIdx.x;
  int row_offset = 0, total_rows = 0;
  Scan(scan_storage).ExclusiveSum(count, row_offset, total_rows);
  __syncthreads();
  int tile_offset = 0, total_tiles = 0;
  Scan(scan_storage).ExclusiveSum((count + token_tile - 1) / token_tile, tile_offset, total_tiles);
  row_offsets[e] = row_offset;
  tile_offsets[e] = tile_offset;
  if (e == 0) *num_tiles = total_tiles;
  if (e < experts) expert_offsets[e] = row_offset;
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
  return row_offset;
}

// Zeroes the slots the later stages accumulate into (ZeroedSlots), by the threads of one block.
__device__ void zero_slots(const ZeroedSlots& slots) {
  for (int i = threadIdx.x; i < slots.counter_count; i += blockDim.x) slots.counters[i] = 0;
  // (constant indices: a thread-dependent index into the parameter's array would copy it to local memory)
  if (threadIdx.x == 0 && slots.amax[0] != nullptr) *slots.amax[0] = 0.0f;
  if (threadIdx.x == 1 && slots.amax[1] != nullptr) *slots.amax[1] = 0.0f;
}

// The whole permute stage for `entries` (token, slot) pairs, by all kScanThreads threads of one block:
// zeroes `zeroed`, counts, plans the tiles and assigns every pair its row.
__device__ void permute_block(const int* __restrict__ topk_ids, const float* __restrict__ topk_weights, int entries,
                              int top_k, int experts, int token_tile, int* __restrict__ expert_offsets,
                              int* __restrict__ num_tiles, TokenTile* __restrict__ tiles, int* __restrict__ slot_rows,
                              float* __restrict__ row_weights, int* __restrict__ sorted_tokens,
                              int* __restrict__ invalid_id_count, const ZeroedSlots& zeroed) {
  __shared__ int counts[kScanThreads];
  counts[threadIdx.x] = 0;
  zero_slots(zeroed);
  __syncthreads();
  int invalid = 0;
  for (int i = threadIdx.x; i < entries; i += kScanThreads) {
    const int expert = topk_ids[i];
    if (expert >= 0 && expert < experts) atomicAdd(&counts[expert], 1); else ++invalid;
  }
  if (invalid != 0 && invalid_id_count != nullptr) atomicAdd(invalid_id_count, invalid);
  __syncthreads();
  const int row_offset = plan_tiles(counts[threadIdx.x], experts, token_tile, expert_offsets, num_tiles, tiles);
  __syncthreads();
  counts[threadIdx.x] = row_offset;   // from here on: each expert's next free row
  __syncthreads();
  for (int entry = threadIdx.x; entry < entries; entry += kScanThreads) {
    const int expert = topk_ids[entry];
    if (expert < 0 || expert >= experts) {
      slot_rows[entry] = -1;
      continue;
    }
    const int row = atomicAdd(&counts[expert], 1);
    slot_rows[entry] = row;
    row_weights[row] = topk_weights[entry];
    sorted_tokens[row] = entry / top_k;
  }
}

}  // namespace
}  // namespace hmoe::permute
