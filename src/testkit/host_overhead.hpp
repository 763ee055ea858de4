// Host-side cost of one layer: CPU time per MoeRunner::run_from_logits call (what the serving
// loop pays per layer when it does not replay graphs), per graph launch, and launches per layer.
#pragma once

#include "hmoe/hmoe.hpp"
#include "testkit/layer_data.hpp"

namespace hmoe::testkit {

struct HostOverhead {
  int num_tokens = 0;
  int calls = 0;                      // timed calls of each kind
  double run_median_us = 0.0;         // CPU time inside one run_from_logits (eager enqueue)
  double run_p90_us = 0.0;
  double graph_launch_median_us = 0.0;  // CPU time of one cudaGraphLaunch of the captured layer
  double replay_run_median_us = 0.0;  // run_from_logits with PlanOptions::replay_graphs, same pointers
  int kernel_launches = 0;            // kernel nodes in the captured layer
  int graph_nodes = 0;                // all nodes (kernels, memsets, ...)
};

// Plans a runner for num_tokens, captures one layer to count its nodes, then times `calls` eager
// run_from_logits calls and `calls` graph launches on the CPU with a steady clock. NOTE: the stream
// is synchronised every 32 calls, outside the timed region, so the launch queue never fills and
// blocks an enqueue (that would time the GPU, not the host).
HostOverhead measure_host_overhead(const LayerWeights& weights, int num_tokens, int calls);

// What the enqueues of a layer cost at least on this host: CPU time of one empty kernel launch
// (1 block, 32 threads) and of one TMA descriptor encode (cuTensorMapEncodeTiled), medians of
// `calls`, timed like measure_host_overhead. A layer's run time minus launches × empty_launch_us
// minus 4 × tensor_map_encode_us (two descriptors per GEMM) is hmoe's own host code.
struct LaunchCosts {
  double empty_launch_us = 0.0;
  double tensor_map_encode_us = 0.0;
};
LaunchCosts measure_launch_costs(int calls);

}  // namespace hmoe::testkit
