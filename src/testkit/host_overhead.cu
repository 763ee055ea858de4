// measure_host_overhead: steady-clock timing of enqueues, graph node counting with cudaGraphGetNodes;
// measure_launch_costs: the same timing of an empty kernel launch and of one TMA descriptor encode.
#include "testkit/host_overhead.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "gemm/tensor_map.hpp"
#include "testkit/cuda_handles.hpp"

namespace hmoe::testkit {
namespace {

constexpr int kSyncEvery = 32;
constexpr int kWarmupCalls = 20;

double percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  return values[static_cast<std::size_t>(fraction * static_cast<double>(values.size() - 1))];
}

template <class Call>
std::vector<double> time_calls(int calls, const Stream& stream, Call&& call) {
  std::vector<double> call_us;
  call_us.reserve(calls);
  for (int index = 0; index < calls; ++index) {
    const auto start = std::chrono::steady_clock::now();
    call();
    const auto stop = std::chrono::steady_clock::now();
    call_us.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
    if ((index + 1) % kSyncEvery == 0) stream.synchronize();
  }
  stream.synchronize();
  return call_us;
}

__global__ void empty_kernel(int* never_written) {
  if (never_written != nullptr && threadIdx.x == 1024) *never_written = 0;
}

}  // namespace

LaunchCosts measure_launch_costs(int calls) {
  const Stream stream;
  DeviceBuffer target(1 << 20);
  const auto launch = [&] {
    empty_kernel<<<1, 32, 0, stream.get()>>>(nullptr);
    HMOE_CUDA_CHECK(cudaGetLastError());
  };
  time_calls(kWarmupCalls, stream, launch);   // module load
  LaunchCosts costs;
  costs.empty_launch_us = percentile(time_calls(calls, stream, launch), 0.5);
  costs.tensor_map_encode_us = percentile(time_calls(calls, stream, [&] {
                                            static_cast<void>(gemm::make_tensor_map(target.get(), 256, 2048, 64, 2));
                                          }),
                                          0.5);
  return costs;
}

HostOverhead measure_host_overhead(const LayerWeights& weights, int num_tokens, int calls) {
  if (num_tokens < 1 || calls < 1) throw Error("hmoe testkit: measure_host_overhead needs num_tokens, calls >= 1");
  const Stream stream;
  PlanOptions plan_options;
  plan_options.max_tokens = num_tokens;
  const MoeRunner runner(weights.spec, plan_options);
  DeviceBuffer workspace(runner.workspace_bytes());
  const LayerInputs inputs = make_layer_inputs(weights, num_tokens, Entry::kLogits, RoutingDraw{}, stream.get());
  DeviceBuffer out(static_cast<std::size_t>(num_tokens) * weights.spec.hidden * sizeof(std::uint16_t));
  RunArgs args = run_args(weights, inputs, out.get());
  args.workspace = workspace.get();
  args.workspace_size = workspace.bytes();
  const void* logits = inputs.router_logits.get();
  auto run = [&] { runner.run_from_logits(args, logits, stream.get()); };

  HostOverhead result;
  result.num_tokens = num_tokens;
  result.calls = calls;
  time_calls(kWarmupCalls, stream, run);

  // Launches per layer: capture one layer and count what the graph holds.
  cudaGraph_t graph = capture_graph(stream.get(), run);
  GraphNodeCounts counts;
  try {
    counts = count_graph_nodes(graph);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  result.kernel_launches = counts.kernels;
  result.graph_nodes = counts.nodes;
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  HMOE_CUDA_CHECK(instantiated);

  try {
    const std::vector<double> run_us = time_calls(calls, stream, run);
    result.run_median_us = percentile(run_us, 0.5);
    result.run_p90_us = percentile(run_us, 0.9);
    time_calls(kWarmupCalls, stream, [&] { HMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream.get())); });
    const std::vector<double> launch_us =
        time_calls(calls, stream, [&] { HMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream.get())); });
    result.graph_launch_median_us = percentile(launch_us, 0.5);
    // The same call through PlanOptions::replay_graphs: after its eager and its capturing call,
    // every call is one cudaGraphLaunch plus the argument checks and the key lookup.
    PlanOptions replay_options = plan_options;
    replay_options.replay_graphs = true;
    const MoeRunner replaying(weights.spec, replay_options);
    auto replay_run = [&] { replaying.run_from_logits(args, logits, stream.get()); };
    time_calls(kWarmupCalls, stream, replay_run);
    const std::vector<double> replay_us = time_calls(calls, stream, replay_run);
    result.replay_run_median_us = percentile(replay_us, 0.5);
  } catch (...) {
    cudaGraphExecDestroy(exec);
    throw;
  }
  cudaGraphExecDestroy(exec);
  return result;
}

}  // namespace hmoe::testkit
