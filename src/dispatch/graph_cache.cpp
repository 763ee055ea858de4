// GraphCache: see graph_cache.hpp.
#include "dispatch/graph_cache.hpp"

#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/graph_capture.hpp"

namespace hmoe::dispatch {

GraphCache::~GraphCache() {
  // NOTE: destructors never throw: errors here (a context already torn down) are ignored.
  for (Entry& entry : graphs_) cudaGraphExecDestroy(entry.exec);
  if (capture_stream_ != nullptr) cudaStreamDestroy(capture_stream_);
}

std::size_t GraphCache::graphs() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return graphs_.size();
}

cudaStream_t GraphCache::capture_stream() {
  int device = 0;
  HMOE_CUDA_CHECK(cudaGetDevice(&device));
  if (capture_stream_ != nullptr && capture_device_ != device) {
    HMOE_CUDA_CHECK(cudaStreamDestroy(capture_stream_));
    capture_stream_ = nullptr;
  }
  if (capture_stream_ == nullptr) {
    HMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
    capture_device_ = device;
  }
  return capture_stream_;
}

GraphCache::Action GraphCache::run(const GraphKey& key, cudaStream_t stream, Enqueue enqueue, const void* context) {
  const std::lock_guard<std::mutex> lock(mutex_);
  // 1. A graph for this key: launch it (graph objects are not thread-safe: launched under the lock).
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
    if (!(it->key == key)) continue;
    if (it != graphs_.begin()) graphs_.splice(graphs_.begin(), graphs_, it);
    HMOE_CUDA_CHECK(cudaGraphLaunch(graphs_.front().exec, stream));
    return Action::kReplayed;
  }
  // 2. First sighting: remember it and run eagerly.
  const auto seen = std::find(seen_once_.begin(), seen_once_.end(), key);
  if (seen == seen_once_.end()) {
    seen_once_.push_front(key);
    if (seen_once_.size() > capacity_) seen_once_.pop_back();
    enqueue(context, stream);
    return Action::kEager;
  }
  seen_once_.erase(seen);
  // 3. Second sighting: capture on the private stream (thread-local mode: other threads' CUDA calls
  // are not affected), instantiate, launch on the caller's stream.
  const cudaStream_t capture = capture_stream();
  cudaGraph_t graph =
      capture_graph(capture, cudaStreamCaptureModeThreadLocal, [&] { enqueue(context, capture); });
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  HMOE_CUDA_CHECK(instantiated);
  graphs_.push_front(Entry{key, exec});
  if (graphs_.size() > capacity_) {
    cudaGraphExecDestroy(graphs_.back().exec);   // freed by CUDA once a launch in flight completes
    graphs_.pop_back();
  }
  HMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  return Action::kCaptured;
}

}  // namespace hmoe::dispatch
