// hmoe expert parallelism over NCCL: each of R ranks owns E/R experts; a layer call routes this
// rank's tokens, sends each (token, slot) pair's x row to the rank owning its expert, runs the local
// experts with hmoe's MoeRunner and sends the results back to be summed in slot order (docs/EP.md).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "hmoe/hmoe.hpp"

namespace hmoe {

// The experts rank `rank` of `world_size` owns: [first_expert, first_expert + num_experts), with
// num_experts = E / world_size. Throws hmoe::Error naming the argument unless 1 ≤ world_size,
// E % world_size == 0 and 0 ≤ rank < world_size.
struct ExpertShard {
  int first_expert = 0;
  int num_experts = 0;
};
ExpertShard expert_shard(int num_experts, int rank, int world_size);

// The spec of one rank's local layer: spec with E / world_size experts and top_k = 1 (every
// received (token, slot) pair is one row with its own routing weight). Prepare each rank's weights
// with it: prepare_weights(ep_local_spec(spec, R), w13 + first_expert·2I·H, w2 + first_expert·H·I,
// ...) on the HF-layout sources; FP8 weight scales are sliced the same way (their first dimension is E).
MoeSpec ep_local_spec(const MoeSpec& spec, int world_size);

// What travels to the expert ranks. kFP8Block128 quantises each x row to e4m3 in 1×128 groups
// (one fp32 scale per group, amax / 448, UE8M0 when the spec asks for it) and dequantises to bf16
// on arrival: half the bytes, one more rounding (docs/EP.md gives its accuracy). Results always
// return as bf16.
enum class EpDispatchDType { kBF16, kFP8Block128 };

struct EpOptions {
  int max_tokens_per_rank = 0;          // largest num_tokens any run on this rank passes
  EpDispatchDType dispatch_dtype = EpDispatchDType::kBF16;
  // Rows this rank can receive per run. 0: the worst case, world_size × max_tokens_per_rank × top_k
  // (every rank sends every pair here). A run that receives more throws after the count exchange,
  // leaving the peers inside the row exchange: abort the communicator then (docs/EP.md).
  int max_recv_rows = 0;
  // The local runner's PlanOptions (orientation, max_workspace_bytes; max_tokens is max_recv_rows).
  Orientation orientation = Orientation::kAuto;
  std::size_t max_local_workspace_bytes = 0;
};

// Optional timing hooks: run_* records each non-null event on the stream at that point. The
// all-to-all time of a run is (dispatch_end − dispatch_begin) + (combine_end − combine_begin); the
// dispatch interval includes the host round trip that reads the exchanged counts.
struct EpPhaseEvents {
  cudaEvent_t dispatch_begin = nullptr;  // before the count exchange
  cudaEvent_t dispatch_end = nullptr;    // after the rows (ids, weights, scales) arrived
  cudaEvent_t combine_begin = nullptr;   // after the local experts, before the results are sent back
  cudaEvent_t combine_end = nullptr;     // after the results arrived, before the weighted sum
};

struct EpRunArgs {
  int num_tokens = 0;                    // this rank's T; 0 is valid and still takes part in the exchanges
  const void* x = nullptr;               // [T, H] bf16, device
  void* out = nullptr;                   // [T, H] bf16, device; may be x itself
  // This rank's experts, prepared with ep_local_spec (and their FP8 scales); correction_bias is the
  // global [E] vector (grouped routing, run_from_logits only).
  Weights weights;
  void* workspace = nullptr;             // device, at least workspace_bytes(), 256-byte aligned
  std::size_t workspace_size = 0;
  int* invalid_id_count = nullptr;       // optional: + 1 per (token, slot) with an id outside [0, E)
  const float* act_scale = nullptr;      // fp8-tensor static scales, as RunArgs (applied on the expert rank)
  const float* intermediate_act_scale = nullptr;
  const EpPhaseEvents* events = nullptr;
};

// One micro-batch of EpMoeLayer::run_overlapped: its own arguments (x, out, and a workspace of its
// own, workspace_bytes() each) and its precomputed routing, as run_from_topk takes them.
struct EpMicroBatch {
  EpRunArgs args;
  const std::int32_t* topk_ids = nullptr;
  const float* topk_weights = nullptr;
};

// Rows exchanged by the last run, per peer rank (for benchmarks: bytes on the wire).
struct EpExchangeCounts {
  std::vector<int> sent_rows;            // [R]: pairs this rank sent to each rank (itself included)
  std::vector<int> received_rows;        // [R]: rows each rank sent here
};

// One rank's part of an expert-parallel MoE layer. Every rank of the communicator must construct
// one with the same spec and options, and call run_* the same number of times in the same order
// (each run is a sequence of collective NCCL groups). Not thread-safe: one run at a time.
class EpMoeLayer {
 public:
  // comm: an initialised communicator of world_size ranks in which this process is `rank`, on the
  // current CUDA device; the caller keeps it alive and destroys it after the layer.
  EpMoeLayer(const MoeSpec& spec, int rank, int world_size, ncclComm_t comm, const EpOptions& options);
  ~EpMoeLayer();
  EpMoeLayer(const EpMoeLayer&) = delete;
  EpMoeLayer& operator=(const EpMoeLayer&) = delete;

  const MoeSpec& spec() const;
  const MoeSpec& local_spec() const;
  ExpertShard shard() const;
  int rank() const;
  int world_size() const;
  std::size_t workspace_bytes() const;
  // The local runner (its plan_info for a received row count, its chunking).
  const MoeRunner& local_runner() const;
  const EpExchangeCounts& last_exchange() const;

  // Precomputed routing: topk_ids [T, k] int32 (global expert ids) and topk_weights [T, k] fp32,
  // device. An id outside [0, E) contributes nothing and is sent nowhere.
  // NOTE: one host synchronisation per run (the exchanged row counts size the NCCL receives), so a
  // run cannot be captured in a CUDA graph; everything else is asynchronous on stream.
  void run_from_topk(const EpRunArgs& args, const std::int32_t* topk_ids, const float* topk_weights,
                     cudaStream_t stream);
  // Routes with the spec's routing function on this rank (router_logits [T, E], device), then as above.
  void run_from_logits(const EpRunArgs& args, const void* router_logits, cudaStream_t stream);
  // Two-batch overlap (docs/EP.md): the micro-batches run in order, and batch b + 1's dispatch
  // (packing, count exchange with its host wait, row exchange) is issued on comm_stream while batch b's
  // local experts run on stream; batch b's results then travel back on comm_stream while batch
  // b + 1 computes. Each batch's output is bit-identical to run_from_topk on it alone. Every rank
  // must pass the same number of micro-batches; comm_stream must not be stream; on return, stream
  // is ordered after every batch's output (comm_stream only after its own work). last_exchange()
  // then describes the last batch.
  void run_overlapped(const std::vector<EpMicroBatch>& batches, cudaStream_t stream, cudaStream_t comm_stream);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace hmoe
