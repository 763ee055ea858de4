// Stream capture into a CUDA graph, ended cleanly when the captured work throws: used by the runner's
// graph cache (dispatch/graph_cache.cpp) and the test kit.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "common/cuda_check.hpp"

namespace hmoe {

// The CUDA graph of whatever `work` enqueued on the stream while capturing in `mode`; the caller destroys it.
template <class Work>
cudaGraph_t capture_graph(cudaStream_t stream, cudaStreamCaptureMode mode, Work&& work) {
  HMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, mode));
  try {
    std::forward<Work>(work)();
  } catch (...) {
    // NOTE: the stream stays in capture mode until the capture is ended; end it so the stream is
    // usable again, then let the original error through.
    cudaGraph_t abandoned = nullptr;
    cudaStreamEndCapture(stream, &abandoned);
    if (abandoned != nullptr) cudaGraphDestroy(abandoned);
    throw;
  }
  cudaGraph_t graph = nullptr;
  HMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  return graph;
}

}  // namespace hmoe
