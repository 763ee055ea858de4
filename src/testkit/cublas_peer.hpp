// The always-available peer of `hmoe bench --peers cublas`: the MoE layer an engine without fused
// kernels runs — per expert, GEMM1 (cuBLAS bf16), one SwiGLU kernel over all rows, per expert GEMM2 —
// on the same card, shapes and expert load as hmoe, captured in a CUDA graph and replayed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hmoe/hmoe.hpp"
#include "testkit/replay_timing.hpp"

namespace hmoe::testkit {

struct PeerRow {
  std::string peer;        // "cublas-loop"
  int num_tokens = 0;
  ReplayTiming timing;
  int kernel_launches = 0;  // calls per layer, mean over input sets: 2 cublasGemmEx per expert hit + SwiGLU
};

// Owns the peer's weights (HF layout: w13 [E, 2I, H], w2 [E, H, I], bf16, the same distribution as
// hmoe's), a cuBLAS handle and its workspace. What it times is GEMMs and activation only: the
// routing, the gather of x rows into expert order and the weighted combine are left out, as for the
// Triton peer of DESIGN.md §4, so hmoe's whole layer is held against the peer's kernels alone.
class CublasExpertLoop {
 public:
  CublasExpertLoop(const MoeSpec& spec, std::uint64_t seed);
  ~CublasExpertLoop();
  CublasExpertLoop(const CublasExpertLoop&) = delete;
  CublasExpertLoop& operator=(const CublasExpertLoop&) = delete;

  // tokens_per_expert: one [E] load per input set (BenchRow::tokens_per_expert), each summing to
  // num_tokens × k. One graph per set, replayed round-robin like hmoe's input sets.
  PeerRow bench(int num_tokens, const std::vector<std::vector<int>>& tokens_per_expert, double seconds_per_point,
                int min_replays) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace hmoe::testkit
