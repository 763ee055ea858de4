// Latency of whole MoE layers as CUDA-graph replays, held against the floor of DESIGN.md §4
// (bytes the call must move or FLOPs it must do, over ceilings measured on the same card).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hmoe/hmoe.hpp"
#include "testkit/layer_data.hpp"
#include "testkit/random_inputs.hpp"
#include "testkit/replay_timing.hpp"

namespace hmoe::testkit {

struct BenchOptions {
  std::vector<int> token_counts;
  RoutingMode routing = RoutingMode::kUniform;
  Orientation orientation = Orientation::kAuto;
  std::uint64_t seed = 1;
  // Independent x + logits sets replayed round-robin: each routes to different experts, so the
  // weights a replay needs are not the ones the previous replay left in L2.
  int input_sets = 4;
  double seconds_per_point = 0.25;  // timed replays per token count, at least min_replays
  int min_replays = 40;
  // Untimed replays before each point's timed ones (GPU seconds). The tuner, whose points run back
  // to back on a GPU already busy, takes less.
  double warmup_seconds = kDefaultWarmupSeconds;
  std::string force_variant;        // PlanOptions::force_variant (the tuner); empty: hmoe chooses
  // Count the experts each input set hits and hold the time against the floor (copies the routing
  // to the host and measures the ceilings once); the tuner, which only ranks variants, turns it off.
  bool measure_floor = true;
  // PlanOptions::skip_stages (`hmoe bench --skip`): time the layer without these stages, after one
  // full run per input set in its own workspace. The rows are then not a valid layer.
  std::uint32_t skip_stages = 0;
  int split_k = 0;                  // PlanOptions::split_k (`hmoe bench --split-k`)
  // PlanOptions::fused_decode (the tuner times its "fused" candidate with kOn). Runs with
  // skip_stages use kOff.
  FusedDecode fused_decode = FusedDecode::kAuto;
};

struct BenchRow {
  int num_tokens = 0;
  int replays = 0;
  double median_us = 0.0;
  double p10_us = 0.0;
  double p90_us = 0.0;
  double tflop_per_s = 0.0;       // 6·T·k·H·I / median
  double gb_per_s = 0.0;          // bytes_touched / median
  double bytes_touched = 0.0;     // mean over input sets: hit experts' w13 + w2, x in, out
  double experts_hit = 0.0;       // mean over input sets
  double floor_us = 0.0;          // mean over input sets of max(bytes / bandwidth, FLOPs / peak)
  double percent_of_floor = 0.0;  // floor / median × 100
  PlanInfo plan;
  // Per input set (measure_floor only): tokens routed to each expert, [set][expert]. Peers replay
  // exactly this load (the cuBLAS loop, bench/peers.py through the JSON).
  std::vector<std::vector<int>> tokens_per_expert;
};

// Weights are generated once (one prepared copy); for each T the runner is planned for T, every input
// set's run_from_logits is captured into its own graph, warmed up, then replays are timed one by one
// with events. on_row, when set, sees each row as soon as it is measured.
std::vector<BenchRow> bench_layer(const MoeSpec& spec, const BenchOptions& options,
                                  const std::function<void(const BenchRow&)>& on_row = {});
// The same with weights the caller generated once (the tuner times many variants on one set).
std::vector<BenchRow> bench_layer(const LayerWeights& weights, const BenchOptions& options,
                                  const std::function<void(const BenchRow&)>& on_row = {});

}  // namespace hmoe::testkit
