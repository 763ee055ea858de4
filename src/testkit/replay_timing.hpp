// Event-timed replays of captured CUDA graphs: the one timing loop every layer benchmark (hmoe and
// its peers) goes through, so their numbers are comparable by construction.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "testkit/cuda_handles.hpp"

namespace hmoe::testkit {

struct ReplayTiming {
  int replays = 0;
  double median_us = 0.0;
  double p10_us = 0.0;
  double p90_us = 0.0;
};

// Replays `graphs` round-robin: three warm-up rounds, then as many replays as fit in
// seconds_per_point (at least min_replays, a whole number of rounds), each timed alone between two
// events. Throws hmoe::Error on any CUDA failure.
ReplayTiming time_graph_replays(const std::vector<GraphExec>& graphs, double seconds_per_point, int min_replays,
                                cudaStream_t stream);

}  // namespace hmoe::testkit
