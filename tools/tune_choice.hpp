// Which variant pair a tuned bucket keeps: the ranking of the tuner's timings, and the final that
// re-times the close calls of its scan the way `hmoe bench` times a layer.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace hmoe::tools {

// Keep the analytic choice unless a variant beats it by more than this: a closer win is within the
// noise of short points, and the minimum over ~16 noisy timings is biased low.
inline constexpr double kNoiseMargin = 1.02;
// Pairs whose scan time is within this of the best (the analytic pair's discounted by the margin) go
// to the final. NOTE: the scan's 0.05 s points on a GPU kept busy back to back read 2-4 % away from
// `hmoe bench` at some buckets, and twice picked the slower of two close pairs (qwen3-30b-a3b bf16
// T = 4096, deepseek-v3-tp8 fp8-block T = 2048: docs/PERF.md).
inline constexpr double kFinalWindow = 1.04;
inline constexpr int kMaxFinalists = 2;
// Each finalist is timed this many times, in ABBA order, and ranked by the mean.
inline constexpr int kFinalRounds = 2;

struct TimedPair {
  std::string id;
  double us = 0.0;
};

// The time a pair is ranked by: the analytic pair's is discounted by the noise margin, so another
// pair ranks ahead of it only when faster by more than the margin.
inline double ranked_us(const std::string& id, double us, const std::string& analytic) {
  return id == analytic ? us / kNoiseMargin : us;
}

// The pairs to re-time, fastest ranked scan time first: those within kFinalWindow of the best, at
// most kMaxFinalists. Fewer than two means no final.
inline std::vector<std::string> finalists(const std::vector<TimedPair>& scan, const std::string& analytic) {
  std::vector<TimedPair> ranked = scan;
  for (TimedPair& pair : ranked) pair.us = ranked_us(pair.id, pair.us, analytic);
  std::stable_sort(ranked.begin(), ranked.end(), [](const TimedPair& a, const TimedPair& b) { return a.us < b.us; });
  std::vector<std::string> chosen;
  for (const TimedPair& pair : ranked) {
    if (static_cast<int>(chosen.size()) == kMaxFinalists || pair.us > ranked.front().us * kFinalWindow) break;
    chosen.push_back(pair.id);
  }
  if (chosen.size() < 2) chosen.clear();
  return chosen;
}

// The order in which a bucket tries pairs (the first to pass the reference check is kept): the
// finalists by their final times, then every other pair by its scan time, each ranked (ranked_us).
// NOTE: final and scan times are never compared with each other: they are taken differently.
inline std::vector<std::string> preference_order(const std::vector<TimedPair>& scan, const std::string& analytic,
                                                 const std::map<std::string, double>& final_us) {
  std::vector<TimedPair> in_final, rest;
  for (const TimedPair& pair : scan) {
    const auto found = final_us.find(pair.id);
    if (found != final_us.end()) {
      in_final.push_back({pair.id, ranked_us(pair.id, found->second, analytic)});
    } else {
      rest.push_back({pair.id, ranked_us(pair.id, pair.us, analytic)});
    }
  }
  const auto faster = [](const TimedPair& a, const TimedPair& b) { return a.us < b.us; };
  std::stable_sort(in_final.begin(), in_final.end(), faster);
  std::stable_sort(rest.begin(), rest.end(), faster);
  std::vector<std::string> order;
  for (const TimedPair& pair : in_final) order.push_back(pair.id);
  for (const TimedPair& pair : rest) order.push_back(pair.id);
  return order;
}

// The finalists in the order of final round `round` (ABBA...: even rounds as given, odd reversed),
// so a clock drift over the final weighs on each pair alike.
inline std::vector<std::string> final_round_order(const std::vector<std::string>& finalists, int round) {
  std::vector<std::string> order = finalists;
  if (round % 2 == 1) std::reverse(order.begin(), order.end());
  return order;
}

}  // namespace hmoe::tools
