// PlanOptions::replay_graphs: a MoeRunner that sees the same call twice (same entry point, T and
// device pointers) captures the layer into a CUDA graph once and from then on enqueues it with one
// cudaGraphLaunch instead of 5–9 kernel launches. The first call of a key runs eagerly (its latency
// is the eager one, never a capture's), the second captures on a private stream and launches the
// graph, later ones only launch. Values behind the pointers may change freely between calls: the
// graph reads them when it runs.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <list>
#include <mutex>

namespace hmoe::dispatch {

// Everything a layer's launches depend on besides the plan (which is a function of T).
struct GraphKey {
  static constexpr int kPointers = 14;
  int entry = 0;        // 0: run_from_logits, 1: run_from_topk
  int num_tokens = 0;
  int device = 0;
  std::array<const void*, kPointers> pointers{};
  bool operator==(const GraphKey& other) const {
    return entry == other.entry && num_tokens == other.num_tokens && device == other.device &&
           pointers == other.pointers;
  }
};

class GraphCache {
 public:
  // At most `capacity` graphs are kept (least recently used goes first; an evicted graph still in
  // flight is freed by CUDA when it completes) and `capacity` keys seen once are remembered.
  explicit GraphCache(std::size_t capacity = 32) : capacity_(capacity) {}
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // Runs the layer for key on stream: replays its graph when there is one; captures `enqueue` into
  // one (on a private stream) and launches it when the key is seen the second time; otherwise
  // calls enqueue(context, stream). enqueue must enqueue the whole layer on the stream it is given and do
  // nothing else. Returns what it did, for tests and benchmarks.
  enum class Action { kEager, kCaptured, kReplayed };
  // NOTE: a plain function and context, not std::function: no heap allocation per run.
  using Enqueue = void (*)(const void* context, cudaStream_t stream);
  Action run(const GraphKey& key, cudaStream_t stream, Enqueue enqueue, const void* context);

  std::size_t graphs() const;

 private:
  struct Entry {
    GraphKey key;
    cudaGraphExec_t exec = nullptr;
  };
  cudaStream_t capture_stream();

  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> graphs_;          // most recently used first
  std::list<GraphKey> seen_once_;    // most recent first
  cudaStream_t capture_stream_ = nullptr;
  int capture_device_ = -1;
};

}  // namespace hmoe::dispatch
