// Owning wrappers for the CUDA objects tests and benchmarks juggle (device memory, streams, events,
// instantiated graphs), so an exception halfway through a check leaks nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "common/cuda_check.hpp"
#include "common/graph_capture.hpp"

namespace hmoe::testkit {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) HMOE_CUDA_CHECK(cudaMalloc(&data_, bytes));
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return data_; }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void release() noexcept {
    // NOTE: no throw from a destructor; a failed free means the context is already broken and the
    // call that broke it has reported that.
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A non-blocking stream: the legacy default stream cannot be captured into a graph.
class Stream {
 public:
  Stream() { HMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  void synchronize() const { HMOE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() { HMOE_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream) const { HMOE_CUDA_CHECK(cudaEventRecord(event_, stream)); }

 private:
  cudaEvent_t event_ = nullptr;
};

// Milliseconds between two recorded, completed events.
inline float elapsed_ms(const Event& start, const Event& stop) {
  float milliseconds = 0.0f;
  HMOE_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start.get(), stop.get()));
  return milliseconds;
}

// The CUDA graph of whatever `work` enqueued on the stream while capturing (global mode, the strictest;
// the caller destroys it).
template <class Work>
cudaGraph_t capture_graph(cudaStream_t stream, Work&& work) {
  return hmoe::capture_graph(stream, cudaStreamCaptureModeGlobal, std::forward<Work>(work));
}

// What a captured graph holds: all its nodes, and of them the kernel and the memset nodes.
struct GraphNodeCounts {
  int nodes = 0;
  int kernels = 0;
  int memsets = 0;
};

inline GraphNodeCounts count_graph_nodes(cudaGraph_t graph) {
  std::size_t count = 0;
  HMOE_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  HMOE_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  GraphNodeCounts counts;
  counts.nodes = static_cast<int>(count);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    HMOE_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    counts.kernels += type == cudaGraphNodeTypeKernel;
    counts.memsets += type == cudaGraphNodeTypeMemset;
  }
  return counts;
}

// An instantiated CUDA graph holding whatever `work` enqueued on the stream while capturing.
class GraphExec {
 public:
  template <class Work>
  static GraphExec capture(cudaStream_t stream, Work&& work) {
    cudaGraph_t graph = capture_graph(stream, std::forward<Work>(work));
    GraphExec result;
    const cudaError_t status = cudaGraphInstantiate(&result.exec_, graph, 0);
    cudaGraphDestroy(graph);
    HMOE_CUDA_CHECK(status);
    return result;
  }

  GraphExec(GraphExec&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}
  GraphExec& operator=(GraphExec&&) = delete;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  ~GraphExec() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  }

  void launch(cudaStream_t stream) const { HMOE_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

 private:
  GraphExec() = default;
  cudaGraphExec_t exec_ = nullptr;
};

template <class T>
std::vector<T> copy_to_host(const void* device_src, std::size_t count, cudaStream_t stream) {
  std::vector<T> host(count);
  if (count > 0) {
    HMOE_CUDA_CHECK(cudaMemcpyAsync(host.data(), device_src, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return host;
}

template <class T>
void copy_to_device(void* device_dst, const std::vector<T>& host, cudaStream_t stream) {
  if (host.empty()) return;
  HMOE_CUDA_CHECK(cudaMemcpyAsync(device_dst, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  // NOTE: the source is pageable host memory owned by the caller; finish before it can go away.
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace hmoe::testkit
