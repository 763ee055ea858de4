// time_graph_replays: warm up, size the run from the warm-up round, time each replay with events.
#include "testkit/replay_timing.hpp"

#include <algorithm>
#include <string>

namespace hmoe::testkit {
namespace {

constexpr int kWarmupRounds = 3;
constexpr int kMaxReplays = 20000;

double percentile(const std::vector<double>& sorted, double fraction) {
  return sorted[static_cast<std::size_t>(fraction * static_cast<double>(sorted.size() - 1))];
}

}  // namespace

ReplayTiming summarize_replays(const std::vector<double>& replay_us, int graphs) {
  if (graphs < 1 || replay_us.size() < static_cast<std::size_t>(graphs))
    throw Error("hmoe testkit: summarize_replays needs at least one replay of each of " + std::to_string(graphs) +
                " graphs, got " + std::to_string(replay_us.size()));
  ReplayTiming timing;
  timing.replays = static_cast<int>(replay_us.size());
  double sum_of_medians = 0.0;
  for (int graph = 0; graph < graphs; ++graph) {
    std::vector<double> own;
    for (std::size_t replay = graph; replay < replay_us.size(); replay += graphs) own.push_back(replay_us[replay]);
    std::sort(own.begin(), own.end());
    sum_of_medians += percentile(own, 0.5);
  }
  timing.median_us = sum_of_medians / graphs;
  std::vector<double> sorted = replay_us;
  std::sort(sorted.begin(), sorted.end());
  timing.p10_us = percentile(sorted, 0.1);
  timing.p90_us = percentile(sorted, 0.9);
  return timing;
}

ReplayTiming time_graph_replays(const std::vector<GraphExec>& graphs, double seconds_per_point, int min_replays,
                                cudaStream_t stream, double warmup_seconds) {
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
  // Then keep replaying, untimed, until warmup_seconds of GPU time have passed: the clocks and the
  // power state settle before the timed replays (three rounds alone are under a millisecond at
  // decode sizes, and a repeated sweep differed by 3.4% at T = 1, 1024 and 4096 with them).
  const double round_s = estimated_replay_s * graphs.size();
  const int extra_rounds = static_cast<int>(std::min(warmup_seconds / std::max(round_s, 1e-7), 1e5));
  for (int round = 0; round < extra_rounds; ++round)
    for (const GraphExec& graph : graphs) graph.launch(stream);
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
  return summarize_replays(replay_us, static_cast<int>(graphs.size()));
}

}  // namespace hmoe::testkit
