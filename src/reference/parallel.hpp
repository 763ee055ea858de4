// The reference's one threading primitive: items handed out one at a time to a pool of threads.
// Internal to src/reference; the oracle is slow work on big tensors, not a library API.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

namespace hmoe::reference {

// threads ≤ 0 means all hardware threads.
inline int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Runs body(item) for item in [0, items) on up to `threads` threads (the caller's included).
inline void parallel_for(int items, int threads, const std::function<void(int)>& body) {
  std::atomic<int> next_item{0};
  const auto worker = [&] {
    for (int item = next_item++; item < items; item = next_item++) body(item);
  };
  std::vector<std::thread> helpers;
  for (int i = 1; i < std::min(resolve_threads(threads), items); ++i) helpers.emplace_back(worker);
  worker();
  for (std::thread& helper : helpers) helper.join();
}

}  // namespace hmoe::reference
