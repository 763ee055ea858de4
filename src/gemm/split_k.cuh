// The split along K at decode sizes: the CTAs of one output tile each multiply a range of K blocks,
// store their fp32 partial to the workspace, and the last one to arrive sums them all and goes on
// to the epilogue alone.
#pragma once

#include "gemm/config.hpp"
#include "gemm/ptx.cuh"
#include "gemm/scheduler.cuh"

namespace hmoe::gemm {

struct SplitArgs {
  float* partials;   // [output tile][split][fragment element][consumer thread]
  int* counters;     // [output tile]: splits arrived so far; zero between launches
};

// Called by every consumer thread with its finished fragment of `item`. Returns false when another
// split will finish the tile; true (with the whole K sum in `accumulator`) in the last one.
// NOTE: the sum runs over the splits in split order whoever arrives last, so results are
// bit-identical from run to run; the stores are fenced before the arrival counts (the pattern of the
// CUDA programming guide's last-block reduction), and the last CTA resets the counter for the next
// launch on the same workspace.
template <class Config>
__device__ bool reduce_splits(float (&accumulator)[Config::kTileN / 2], const WorkItem& item, int splits,
                              const SplitArgs& args) {
  constexpr int kFragment = Config::kTileN / 2;
  constexpr int kConsumerThreads = 128 * Config::kConsumers;
  constexpr int kConsumerBarrier = 1;   // the consumer warpgroups' named barrier
  __shared__ int last_arrival;
  float* tile = args.partials + static_cast<long long>(item.output_tile) * splits * Config::kTileFloats;
  const int thread = threadIdx.x;
  float* mine = tile + item.split * Config::kTileFloats;
  #pragma unroll
  for (int i = 0; i < kFragment; ++i) __stcg(mine + i * kConsumerThreads + thread, accumulator[i]);
  __threadfence();
  ptx::named_barrier_sync(kConsumerBarrier, kConsumerThreads);
  if (thread == 0) {
    const int arrived = atomicAdd(&args.counters[item.output_tile], 1);
    last_arrival = arrived == splits - 1;
    if (last_arrival) args.counters[item.output_tile] = 0;
  }
  ptx::named_barrier_sync(kConsumerBarrier, kConsumerThreads);
  if (!last_arrival) return false;
  __threadfence();
  float sum[kFragment];
  #pragma unroll
  for (int i = 0; i < kFragment; ++i) sum[i] = 0.0f;
  for (int split = 0; split < splits; ++split) {
    const float* partial = tile + split * Config::kTileFloats;
    #pragma unroll
    for (int i = 0; i < kFragment; ++i)
      sum[i] += split == item.split ? accumulator[i] : __ldcg(partial + i * kConsumerThreads + thread);
  }
  #pragma unroll
  for (int i = 0; i < kFragment; ++i) accumulator[i] = sum[i];
  return true;
}

}  // namespace hmoe::gemm
