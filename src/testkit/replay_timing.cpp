// time_graph_replays: warm up, size the run from the warm-up round, time each replay with events.
#include "testkit/replay_timing.hpp"

#include <algorithm>

namespace hmoe::testkit {
namespace {

constexpr int kWarmupRounds = 3;
constexpr int kMaxReplays = 20000;

double percentile(const std::vector<double>& sorted, double fraction) {
  return sorted[static_cast<std::size_t>(fraction * static_cast<double>(sorted.size() - 1))];
}

}  // namespace

ReplayTiming time_graph_replays(const std::vector<GraphExec>& graphs, double seconds_per_point, int min_replays,
                                cudaStream_t stream) {
  if (graphs.empty()) throw Error("hmoe testkit: time_graph_replays needs at least one graph");
  const Event round_start;
  const Event round_stop;
  for (int round = 0; round < kWarmupRounds; ++round) {
    if (round == kWarmupRounds - 1) round_start.record(stream);
    for (const GraphExec& graph : graphs) graph.launch(stream);
  }
  round_stop.record(stream);
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double estimated_replay_s = elapsed_ms(round_start, round_stop) * 1e-3 / graphs.size();
  int replays = static_cast<int>(seconds_per_point / std::max(estimated_replay_s, 1e-7));
  replays = std::clamp(replays, std::max(min_replays, 1), kMaxReplays);
  replays += static_cast<int>(graphs.size()) - 1 - (replays - 1) % static_cast<int>(graphs.size());

  // NOTE: consecutive marks time each replay alone; the host enqueues far ahead of the GPU, so
  // launch overhead between replays is hidden exactly as in a serving loop replaying graphs.
  std::vector<Event> marks(replays + 1);
  marks[0].record(stream);
  for (int replay = 0; replay < replays; ++replay) {
    graphs[replay % graphs.size()].launch(stream);
    marks[replay + 1].record(stream);
  }
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  HMOE_CUDA_CHECK(cudaGetLastError());
  std::vector<double> replay_us;
  replay_us.reserve(replays);
  for (int replay = 0; replay < replays; ++replay) replay_us.push_back(1e3 * elapsed_ms(marks[replay], marks[replay + 1]));
  std::sort(replay_us.begin(), replay_us.end());

  ReplayTiming timing;
  timing.replays = replays;
  timing.median_us = percentile(replay_us, 0.5);
  timing.p10_us = percentile(replay_us, 0.1);
  timing.p90_us = percentile(replay_us, 0.9);
  return timing;
}

}  // namespace hmoe::testkit
