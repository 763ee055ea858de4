// Event-timed replays of captured CUDA graphs: the one timing loop every layer benchmark (hmoe and
// its peers) goes through, so their numbers are comparable by construction.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "testkit/cuda_handles.hpp"

namespace hmoe::testkit {

struct ReplayTiming {
  int replays = 0;
  // The mean over the graphs (input sets) of each graph's median replay time. NOTE: input sets route
  // to different experts and take different times, so all replays together form a mixture whose
  // median jumps between the sets' modes: on H200 that moved one point of a repeated sweep by 3.1%
  // (qwen3-30b-a3b T = 1024, p10–p90 over 4% wide) while each set's own median is stable.
  double median_us = 0.0;
  double p10_us = 0.0;   // over all replays
  double p90_us = 0.0;
};

// The statistics of replay times taken round-robin over `graphs` graphs (replay i ran graph i % graphs).
ReplayTiming summarize_replays(const std::vector<double>& replay_us, int graphs);

// Untimed replays before the timed ones, in seconds of GPU time: the clocks and the power state settle.
inline constexpr double kDefaultWarmupSeconds = 0.1;

// Replays `graphs` round-robin: warm-up rounds for warmup_seconds of GPU time, then as many replays as
// fit in seconds_per_point (at least min_replays, a whole number of rounds), each timed alone between
// two events. Throws hmoe::Error on any CUDA failure.
ReplayTiming time_graph_replays(const std::vector<GraphExec>& graphs, double seconds_per_point, int min_replays,
                                cudaStream_t stream, double warmup_seconds = kDefaultWarmupSeconds);

}  // namespace hmoe::testkit
