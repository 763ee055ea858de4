// EpMoeLayer: route → plan and pack the send rows → exchange counts (the one host sync) →
// exchange rows → local experts (MoeRunner, top_k = 1) → send results back → weighted sum in slot
// order, all on the caller's stream (docs/EP.md).
#include <cstdint>
#include <string>
#include <vector>

#include "combine/combine.hpp"
#include "common/arguments.hpp"
#include "common/cuda_check.hpp"
#include "ep/config.hpp"
#include "ep/dispatch_kernels.hpp"
#include "ep/dispatch_plan.hpp"
#include "ep/exchange.hpp"
#include "hmoe/ep.hpp"
#include "routing/routing.hpp"

namespace hmoe {

struct EpMoeLayer::State {
  State(const ep::EpConfig& ep_config, ncclComm_t nccl_comm)
      : config(ep_config),
        comm(nccl_comm),
        local_runner(config.local_spec, ep::local_plan_options(config)),
        layout(ep::ep_workspace_layout(config, local_runner.workspace_bytes())) {}
  ~State() {
    if (host_counts != nullptr) cudaFreeHost(host_counts);
    for (cudaEvent_t event : events) cudaEventDestroy(event);
  }

  template <typename T>
  T* at(const EpRunArgs& args, std::size_t offset) const {
    return reinterpret_cast<T*>(static_cast<std::uint8_t*>(args.workspace) + offset);
  }

  // One run's state between its phases. dispatch → compute → send_back → finish; run() does them
  // back to back on one stream, run_overlapped() interleaves two micro-batches' phases on two.
  struct Flight {
    const EpRunArgs* args = nullptr;
    int pairs = 0;
    ep::DispatchBuffers plan;
    void* send_rows = nullptr;
    std::vector<int> send_counts, send_offsets;
    ep::ReceivePlan receive;
    void* recv_rows = nullptr;
  };
  void dispatch(Flight& flight, const EpRunArgs& args, const std::int32_t* topk_ids, const float* topk_weights,
                cudaStream_t stream);
  void compute(const Flight& flight, cudaStream_t stream);
  void send_back(const Flight& flight, cudaStream_t stream);
  void finish(const Flight& flight, cudaStream_t stream);

  void run(const EpRunArgs& args, const std::int32_t* topk_ids, const float* topk_weights, cudaStream_t stream) {
    Flight flight;
    dispatch(flight, args, topk_ids, topk_weights, stream);
    compute(flight, stream);
    send_back(flight, stream);
    finish(flight, stream);
  }
  // The events run_overlapped orders its two streams with (created on first use, reused).
  cudaEvent_t event(std::size_t index) {
    while (events.size() <= index) {
      cudaEvent_t created = nullptr;
      HMOE_CUDA_CHECK(cudaEventCreateWithFlags(&created, cudaEventDisableTiming));
      events.push_back(created);
    }
    return events[index];
  }

  ep::EpConfig config;
  ncclComm_t comm;
  MoeRunner local_runner;
  ep::EpWorkspaceLayout layout;
  int* host_counts = nullptr;            // pinned [2R]: the exchanged counts, read after the one sync
  EpExchangeCounts last;
  std::vector<cudaEvent_t> events;
};

namespace {

void record(const EpPhaseEvents* events, cudaEvent_t EpPhaseEvents::*which, cudaStream_t stream) {
  if (events != nullptr && events->*which != nullptr) HMOE_CUDA_CHECK(cudaEventRecord(events->*which, stream));
}

}  // namespace

// Route-independent part of a run up to the rows' arrival: plan and pack the send rows, exchange
// the counts (the one host synchronisation, on `stream`), exchange the rows.
void EpMoeLayer::State::dispatch(Flight& flight, const EpRunArgs& args, const std::int32_t* topk_ids,
                                 const float* topk_weights, cudaStream_t stream) {
  const MoeSpec& spec = config.spec;
  const int world_size = config.world_size;
  const std::size_t hidden = spec.hidden;
  flight.args = &args;
  flight.pairs = args.num_tokens * spec.top_k;

  ep::DispatchBuffers& plan = flight.plan;
  plan.chunk_bases = at<int>(args, layout.chunk_bases);
  plan.send_counts = at<int>(args, layout.exchange_counts);
  plan.valid_rows = at<int>(args, layout.valid_rows);
  plan.pair_rows = at<int>(args, layout.pair_rows);
  plan.send_tokens = at<int>(args, layout.send_tokens);
  plan.send_ids = at<std::int32_t>(args, layout.send_ids);
  plan.send_weights = at<float>(args, layout.send_weights);
  ep::launch_dispatch_plan(topk_ids, topk_weights, args.num_tokens, spec.top_k, spec.num_experts, world_size, plan,
                           args.invalid_id_count, stream);
  flight.send_rows = at<void>(args, layout.send_rows);
  float* send_scales = config.fp8_dispatch ? at<float>(args, layout.send_scales) : nullptr;
  if (config.fp8_dispatch)
    ep::launch_pack_rows_fp8(args.x, plan.send_tokens, plan.valid_rows, flight.pairs, spec.hidden, spec.ue8m0_scales,
                             flight.send_rows, send_scales, stream);
  else
    ep::launch_pack_rows(args.x, plan.send_tokens, plan.valid_rows, flight.pairs, spec.hidden, flight.send_rows,
                         stream);

  // NOTE: the one host synchronisation: NCCL's receives need their sizes on the host, so the
  // counts come back before the rows can be posted (docs/EP.md weighs the alternatives).
  record(args.events, &EpPhaseEvents::dispatch_begin, stream);
  ep::exchange_counts(plan.send_counts, world_size, comm, stream);
  HMOE_CUDA_CHECK(cudaMemcpyAsync(host_counts, plan.send_counts, 2 * sizeof(int) * world_size, cudaMemcpyDeviceToHost,
                                  stream));
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  flight.send_counts.assign(host_counts, host_counts + world_size);
  flight.send_offsets = ep::exclusive_offsets(flight.send_counts);
  flight.receive = ep::plan_receive(std::vector<int>(host_counts + world_size, host_counts + 2 * world_size));
  const int received = flight.receive.total_rows();
  if (received > config.max_recv_rows)
    throw Error("hmoe: EP rank " + std::to_string(config.rank) + " receives " + std::to_string(received) +
                " rows in this run, more than EpOptions.max_recv_rows = " + std::to_string(config.max_recv_rows) +
                "; its peers wait inside the row exchange: abort the communicator (ncclCommAbort)");

  flight.recv_rows = at<void>(args, layout.recv_rows);
  std::int32_t* recv_ids = at<std::int32_t>(args, layout.recv_ids);
  float* recv_weights = at<float>(args, layout.recv_weights);
  void* recv_fp8_rows = config.fp8_dispatch ? at<void>(args, layout.recv_fp8_rows) : nullptr;
  float* recv_scales = config.fp8_dispatch ? at<float>(args, layout.recv_scales) : nullptr;
  std::vector<ep::RowArray> dispatched = {
      {flight.send_rows, config.fp8_dispatch ? recv_fp8_rows : flight.recv_rows, hidden * (config.fp8_dispatch ? 1 : 2)},
      {plan.send_ids, recv_ids, sizeof(std::int32_t)},
      {plan.send_weights, recv_weights, sizeof(float)}};
  if (config.fp8_dispatch)
    dispatched.push_back({send_scales, recv_scales, sizeof(float) * config.dispatch_groups});
  ep::exchange_rows(dispatched, flight.send_counts, flight.send_offsets, flight.receive.recv_counts,
                    flight.receive.recv_offsets, comm, stream);
  record(args.events, &EpPhaseEvents::dispatch_end, stream);
}

// The received rows through this rank's experts, in place.
void EpMoeLayer::State::compute(const Flight& flight, cudaStream_t stream) {
  const EpRunArgs& args = *flight.args;
  const int received = flight.receive.total_rows();
  if (config.fp8_dispatch)
    ep::launch_unpack_fp8_rows(at<void>(args, layout.recv_fp8_rows), at<float>(args, layout.recv_scales), received,
                               config.spec.hidden, flight.recv_rows, stream);
  // Each received pair is one token of the local layer (top_k = 1, its own weight); the output
  // overwrites the received rows in place.
  RunArgs local;
  local.num_tokens = received;
  local.x = flight.recv_rows;
  local.out = flight.recv_rows;
  local.weights = args.weights;
  local.weights.correction_bias = nullptr;
  local.workspace = at<void>(args, layout.runner);
  local.workspace_size = local_runner.workspace_bytes();
  local.act_scale = args.act_scale;
  local.intermediate_act_scale = args.intermediate_act_scale;
  local_runner.run_from_topk(local, at<std::int32_t>(args, layout.recv_ids), at<float>(args, layout.recv_weights),
                             stream);
}

// The results go back to where their rows came from, into the send buffer (free since the
// dispatch exchange completed earlier), so returned row i is send row i.
void EpMoeLayer::State::send_back(const Flight& flight, cudaStream_t stream) {
  record(flight.args->events, &EpPhaseEvents::combine_begin, stream);
  ep::exchange_rows({{flight.recv_rows, flight.send_rows, static_cast<std::size_t>(config.spec.hidden) * 2}},
                    flight.receive.recv_counts, flight.receive.recv_offsets, flight.send_counts, flight.send_offsets,
                    comm, stream);
  record(flight.args->events, &EpPhaseEvents::combine_end, stream);
}

void EpMoeLayer::State::finish(const Flight& flight, cudaStream_t stream) {
  const EpRunArgs& args = *flight.args;
  if (args.num_tokens > 0)
    combine::launch_combine(flight.send_rows, flight.plan.pair_rows, args.num_tokens, config.spec.top_k,
                            config.spec.hidden, args.out, stream);
  last.sent_rows = flight.send_counts;
  last.received_rows = flight.receive.recv_counts;
}

EpMoeLayer::EpMoeLayer(const MoeSpec& spec, int rank, int world_size, ncclComm_t comm, const EpOptions& options) {
  const ep::EpConfig config = ep::make_ep_config(spec, rank, world_size, options);
  if (comm == nullptr) throw Error("hmoe: EpMoeLayer comm is null: expected an initialised ncclComm_t");
  int comm_ranks = 0, comm_rank = 0, comm_device = 0, device = 0;
  HMOE_NCCL_CHECK(ncclCommCount(comm, &comm_ranks));
  HMOE_NCCL_CHECK(ncclCommUserRank(comm, &comm_rank));
  HMOE_NCCL_CHECK(ncclCommCuDevice(comm, &comm_device));
  HMOE_CUDA_CHECK(cudaGetDevice(&device));
  if (comm_ranks != world_size || comm_rank != rank)
    throw Error("hmoe: EP rank " + std::to_string(rank) + " of world_size " + std::to_string(world_size) +
                " does not match the communicator (rank " + std::to_string(comm_rank) + " of " +
                std::to_string(comm_ranks) + ")");
  if (comm_device != device)
    throw Error("hmoe: the EP communicator lives on device " + std::to_string(comm_device) +
                " but the current device is " + std::to_string(device) + ": call cudaSetDevice first");
  state_ = std::make_unique<State>(config, comm);
  HMOE_CUDA_CHECK(cudaMallocHost(&state_->host_counts, 2 * sizeof(int) * world_size));
  ep::prepare_dispatch_kernels();
  routing::prepare(spec);
  combine::prepare();
}

EpMoeLayer::~EpMoeLayer() = default;

const MoeSpec& EpMoeLayer::spec() const { return state_->config.spec; }
const MoeSpec& EpMoeLayer::local_spec() const { return state_->config.local_spec; }
ExpertShard EpMoeLayer::shard() const { return state_->config.shard; }
int EpMoeLayer::rank() const { return state_->config.rank; }
int EpMoeLayer::world_size() const { return state_->config.world_size; }
std::size_t EpMoeLayer::workspace_bytes() const { return state_->layout.total; }
const MoeRunner& EpMoeLayer::local_runner() const { return state_->local_runner; }
const EpExchangeCounts& EpMoeLayer::last_exchange() const { return state_->last; }

void EpMoeLayer::run_from_topk(const EpRunArgs& args, const std::int32_t* topk_ids, const float* topk_weights,
                               cudaStream_t stream) {
  ep::check_topk_args(state_->config, args, workspace_bytes(), topk_ids, topk_weights);
  state_->run(args, topk_ids, topk_weights, stream);
}

void EpMoeLayer::run_overlapped(const std::vector<EpMicroBatch>& batches, cudaStream_t stream,
                                cudaStream_t comm_stream) {
  if (comm_stream == stream)
    throw Error("hmoe: EpMoeLayer::run_overlapped needs a comm_stream other than stream (the overlap is between them)");
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const EpMicroBatch& batch = batches[b];
    ep::check_topk_args(state_->config, batch.args, workspace_bytes(), batch.topk_ids, batch.topk_weights);
    for (std::size_t other = 0; other < b; ++other)
      if (arguments::overlap({"", batch.args.workspace, workspace_bytes()},
                             {"", batches[other].args.workspace, workspace_bytes()}))
        throw Error("hmoe: EpMicroBatch " + std::to_string(b) + " workspace overlaps micro-batch " +
                    std::to_string(other) + "'s: every micro-batch needs its own (workspace_bytes() each)");
  }
  if (batches.empty()) return;
  State& state = *state_;
  // Events: 0 = entry; per batch b: 3b+1 dispatched, 3b+2 computed, 3b+3 returned.
  const auto dispatched = [&](std::size_t b) { return state.event(3 * b + 1); };
  const auto computed = [&](std::size_t b) { return state.event(3 * b + 2); };
  const auto returned = [&](std::size_t b) { return state.event(3 * b + 3); };
  // Everything the caller enqueued on stream before (x, routing) precedes the first packing.
  HMOE_CUDA_CHECK(cudaEventRecord(state.event(0), stream));
  HMOE_CUDA_CHECK(cudaStreamWaitEvent(comm_stream, state.event(0), 0));
  std::vector<State::Flight> flights(batches.size());
  state.dispatch(flights[0], batches[0].args, batches[0].topk_ids, batches[0].topk_weights, comm_stream);
  HMOE_CUDA_CHECK(cudaEventRecord(dispatched(0), comm_stream));
  for (std::size_t b = 0; b < batches.size(); ++b) {
    HMOE_CUDA_CHECK(cudaStreamWaitEvent(stream, dispatched(b), 0));
    state.compute(flights[b], stream);
    HMOE_CUDA_CHECK(cudaEventRecord(computed(b), stream));
    // NOTE: the next batch's dispatch (and its host wait for the counts) runs while batch b computes.
    if (b + 1 < batches.size()) {
      state.dispatch(flights[b + 1], batches[b + 1].args, batches[b + 1].topk_ids, batches[b + 1].topk_weights,
                     comm_stream);
      HMOE_CUDA_CHECK(cudaEventRecord(dispatched(b + 1), comm_stream));
    }
    HMOE_CUDA_CHECK(cudaStreamWaitEvent(comm_stream, computed(b), 0));
    state.send_back(flights[b], comm_stream);
    HMOE_CUDA_CHECK(cudaEventRecord(returned(b), comm_stream));
    HMOE_CUDA_CHECK(cudaStreamWaitEvent(stream, returned(b), 0));
    state.finish(flights[b], stream);
  }
}

void EpMoeLayer::run_from_logits(const EpRunArgs& args, const void* router_logits, cudaStream_t stream) {
  ep::check_logits_args(state_->config, args, workspace_bytes(), router_logits);
  std::int32_t* topk_ids = state_->at<std::int32_t>(args, state_->layout.topk_ids);
  float* topk_weights = state_->at<float>(args, state_->layout.topk_weights);
  if (args.num_tokens > 0)
    routing::launch_topk(state_->config.spec, router_logits, args.weights.correction_bias, args.num_tokens, topk_ids,
                         topk_weights, stream);
  state_->run(args, topk_ids, topk_weights, stream);
}

}  // namespace hmoe
