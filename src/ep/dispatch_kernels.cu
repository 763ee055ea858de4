// The expert-parallel dispatch on the device. The plan is a stable counting sort of the (token,
// slot) pairs by destination rank in three launches: count per chunk of 256 pairs, one block
// scanning the chunk counts into per-chunk bases, then each chunk places its pairs in order.
// No atomics decide a position, so the plan equals plan_dispatch bit for bit, run after run.
#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common/cuda_check.hpp"
#include "ep/config.hpp"
#include "ep/dispatch_kernels.hpp"
#include "quant/activations.hpp"

namespace hmoe::ep {
namespace {

constexpr int kChunk = kPlanChunkPairs;  // threads of the count and place kernels: one pair each
constexpr int kWarpsPerChunk = kChunk / 32;
constexpr int kScanThreads = 1024;       // ≥ any world size (world_size ≤ E ≤ kMaxExperts)
constexpr int kRowThreads = 128;

static_assert(kMaxExperts <= kScanThreads, "one scan thread per rank");

__device__ __forceinline__ int destination(std::int32_t expert, int experts, int experts_per_rank) {
  return expert >= 0 && expert < experts ? expert / experts_per_rank : -1;
}

__global__ void __launch_bounds__(kChunk) count_chunks_kernel(const std::int32_t* __restrict__ topk_ids, int pairs,
                                                             int experts, int world_size, int* __restrict__ chunk_bases,
                                                             int* __restrict__ invalid_id_count) {
  extern __shared__ int rank_counts[];
  for (int r = threadIdx.x; r < world_size; r += kChunk) rank_counts[r] = 0;
  __syncthreads();
  const int pair = blockIdx.x * kChunk + threadIdx.x;
  int invalid = 0;
  if (pair < pairs) {
    const int rank = destination(topk_ids[pair], experts, experts / world_size);
    if (rank >= 0)
      atomicAdd(&rank_counts[rank], 1);
    else
      invalid = 1;
  }
  const int block_invalid = __syncthreads_count(invalid);
  for (int r = threadIdx.x; r < world_size; r += kChunk)
    chunk_bases[static_cast<long long>(blockIdx.x) * world_size + r] = rank_counts[r];
  if (threadIdx.x == 0 && block_invalid > 0 && invalid_id_count != nullptr) atomicAdd(invalid_id_count, block_invalid);
}

// Thread r owns destination r: its total over the chunks, then (after a scan over ranks gives the
// destination's first send row) each chunk's first row for it.
__global__ void __launch_bounds__(kScanThreads) scan_chunks_kernel(int* __restrict__ chunk_bases, int chunks,
                                                                   int world_size, int* __restrict__ send_counts,
                                                                   int* __restrict__ valid_rows) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int rank = threadIdx.x;
  int total = 0;
  // NOTE: one thread walks every chunk of its rank (128 chunks at T = 4096, k = 8); unrolled, its
  // independent loads overlap instead of paying one memory latency each.
  if (rank < world_size) {
    #pragma unroll 8
    for (int c = 0; c < chunks; ++c) total += chunk_bases[static_cast<long long>(c) * world_size + rank];
  }
  int first_row = 0, all_rows = 0;
  Scan(scan_storage).ExclusiveSum(total, first_row, all_rows);
  if (rank < world_size) {
    int running = first_row;
    #pragma unroll 8
    for (int c = 0; c < chunks; ++c) {
      int& base = chunk_bases[static_cast<long long>(c) * world_size + rank];
      const int count = base;
      base = running;
      running += count;
    }
    send_counts[rank] = total;
  }
  if (rank == 0) *valid_rows = all_rows;
}

// Pairs of a chunk take their rows warp by warp, in pair order: inside a warp, lanes bound for the
// same rank (__match_any_sync) count the lower lanes among them; the group's first lane then moves
// that rank's cursor past the group.
__global__ void __launch_bounds__(kChunk) place_pairs_kernel(const std::int32_t* __restrict__ topk_ids,
                                                             const float* __restrict__ topk_weights, int pairs,
                                                             int top_k, int experts, int world_size,
                                                             const int* __restrict__ chunk_bases,
                                                             DispatchBuffers buffers) {
  extern __shared__ int cursor[];
  for (int r = threadIdx.x; r < world_size; r += kChunk)
    cursor[r] = chunk_bases[static_cast<long long>(blockIdx.x) * world_size + r];
  __syncthreads();
  const int experts_per_rank = experts / world_size;
  const int pair = blockIdx.x * kChunk + threadIdx.x;
  const std::int32_t expert = pair < pairs ? topk_ids[pair] : -1;
  const int rank = destination(expert, experts, experts_per_rank);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned same_rank = __match_any_sync(0xffffffffu, rank);
  const int lower_lanes = __popc(same_rank & ((1u << lane) - 1u));
  int row = -1;
  for (int w = 0; w < kWarpsPerChunk; ++w) {
    if (warp == w && rank >= 0) row = cursor[rank] + lower_lanes;
    __syncwarp();
    if (warp == w && rank >= 0 && lower_lanes == 0) cursor[rank] += __popc(same_rank);
    __syncthreads();
  }
  if (pair >= pairs) return;
  buffers.pair_rows[pair] = row;
  if (row < 0) return;
  buffers.send_tokens[row] = pair / top_k;
  buffers.send_ids[row] = expert % experts_per_rank;
  buffers.send_weights[row] = topk_weights[pair];
}

__global__ void __launch_bounds__(kRowThreads) pack_rows_kernel(const uint4* __restrict__ x,
                                                                const int* __restrict__ send_tokens,
                                                                const int* __restrict__ valid_rows, int vectors_per_row,
                                                                uint4* __restrict__ send_rows) {
  const int row = blockIdx.x;
  if (row >= *valid_rows) return;
  const uint4* source = x + static_cast<long long>(send_tokens[row]) * vectors_per_row;
  uint4* destination_row = send_rows + static_cast<long long>(row) * vectors_per_row;
  for (int v = threadIdx.x; v < vectors_per_row; v += kRowThreads) destination_row[v] = source[v];
}

__global__ void __launch_bounds__(kRowThreads) unpack_fp8_rows_kernel(const std::uint32_t* __restrict__ fp8_rows,
                                                                      const float* __restrict__ scales, int hidden,
                                                                      uint2* __restrict__ bf16_rows) {
  const long long row = blockIdx.x;
  const int quads = hidden / 4;
  const int groups = hidden / kDispatchGroup;
  for (int q = threadIdx.x; q < quads; q += kRowThreads) {
    const std::uint32_t packed = fp8_rows[row * quads + q];
    const float scale = scales[row * groups + 4 * q / kDispatchGroup];
    float values[4];
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      __nv_fp8_e4m3 value;
      value.__x = static_cast<__nv_fp8_storage_t>((packed >> (8 * i)) & 0xFFu);
      values[i] = static_cast<float>(value) * scale;
    }
    uint2 out;
    *reinterpret_cast<__nv_bfloat162*>(&out.x) = __floats2bfloat162_rn(values[0], values[1]);
    *reinterpret_cast<__nv_bfloat162*>(&out.y) = __floats2bfloat162_rn(values[2], values[3]);
    bf16_rows[row * quads + q] = out;
  }
}

}  // namespace

void launch_dispatch_plan(const std::int32_t* topk_ids, const float* topk_weights, int num_tokens, int top_k,
                          int num_experts, int world_size, const DispatchBuffers& buffers, int* invalid_id_count,
                          cudaStream_t stream) {
  const int pairs = num_tokens * top_k;
  if (pairs == 0) {
    HMOE_CUDA_CHECK(cudaMemsetAsync(buffers.send_counts, 0, sizeof(int) * world_size, stream));
    HMOE_CUDA_CHECK(cudaMemsetAsync(buffers.valid_rows, 0, sizeof(int), stream));
    return;
  }
  const int chunks = plan_chunks(pairs);
  const std::size_t cursor_bytes = sizeof(int) * world_size;
  count_chunks_kernel<<<chunks, kChunk, cursor_bytes, stream>>>(topk_ids, pairs, num_experts, world_size,
                                                               buffers.chunk_bases, invalid_id_count);
  HMOE_CUDA_CHECK(cudaGetLastError());
  scan_chunks_kernel<<<1, kScanThreads, 0, stream>>>(buffers.chunk_bases, chunks, world_size, buffers.send_counts,
                                                     buffers.valid_rows);
  HMOE_CUDA_CHECK(cudaGetLastError());
  place_pairs_kernel<<<chunks, kChunk, cursor_bytes, stream>>>(topk_ids, topk_weights, pairs, top_k, num_experts,
                                                               world_size, buffers.chunk_bases, buffers);
  HMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_pack_rows(const void* x, const int* send_tokens, const int* valid_rows, int max_rows, int hidden,
                      void* send_rows, cudaStream_t stream) {
  if (max_rows == 0) return;
  pack_rows_kernel<<<max_rows, kRowThreads, 0, stream>>>(static_cast<const uint4*>(x), send_tokens, valid_rows,
                                                         hidden / 8, static_cast<uint4*>(send_rows));
  HMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_pack_rows_fp8(const void* x, const int* send_tokens, const int* valid_rows, int max_rows, int hidden,
                          bool ue8m0, void* send_rows, float* send_scales, cudaStream_t stream) {
  MoeSpec block_scheme;
  block_scheme.weight_dtype = WeightDType::kFP8E4M3;
  block_scheme.scheme = QuantScheme::kBlock128;
  block_scheme.ue8m0_scales = ue8m0;
  quant::ActivationRows rows;
  rows.source = x;
  rows.source_row = send_tokens;
  rows.num_rows = valid_rows;
  rows.max_rows = max_rows;
  rows.cols = hidden;
  quant::launch_quantize_rows(block_scheme, rows, nullptr, send_rows, send_scales, stream);
}

void launch_unpack_fp8_rows(const void* fp8_rows, const float* scales, int rows, int hidden, void* bf16_rows,
                            cudaStream_t stream) {
  if (rows == 0) return;
  unpack_fp8_rows_kernel<<<rows, kRowThreads, 0, stream>>>(static_cast<const std::uint32_t*>(fp8_rows), scales, hidden,
                                                           static_cast<uint2*>(bf16_rows));
  HMOE_CUDA_CHECK(cudaGetLastError());
}

void prepare_dispatch_kernels() {
  cudaFuncAttributes attributes;
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, count_chunks_kernel));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, scan_chunks_kernel));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, place_pairs_kernel));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, pack_rows_kernel));
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, unpack_fp8_rows_kernel));
  quant::prepare();
}

}  // namespace hmoe::ep
