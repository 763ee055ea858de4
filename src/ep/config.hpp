// The host side of an expert-parallel layer that needs no device: its validated configuration,
// the workspace layout and the checks every run makes before it enqueues anything.
#pragma once

#include <cstddef>

#include "hmoe/ep.hpp"
#include "hmoe/hmoe.hpp"

namespace hmoe::ep {

// Largest token count of one MoeRunner (its PlanOptions::max_tokens bound): caps both the tokens
// per rank and the rows one rank receives.
inline constexpr int kMaxRows = 1 << 20;
// Columns per FP8 dispatch scale (1×128 groups, as fp8-block activations).
inline constexpr int kDispatchGroup = 128;

struct EpConfig {
  MoeSpec spec;                 // the global layer (E experts, top_k)
  MoeSpec local_spec;           // ep_local_spec(spec, world_size)
  int rank = 0;
  int world_size = 1;
  ExpertShard shard;
  EpOptions options;
  int max_pairs = 0;            // max_tokens_per_rank × top_k: send rows at most
  int max_recv_rows = 0;        // options.max_recv_rows, or the worst case when 0
  bool fp8_dispatch = false;
  int dispatch_groups = 0;      // H / 128 scales per row with FP8 dispatch, else 0
  std::size_t w13_scale_bytes = 0;  // this rank's FP8 weight scales (overlap checks), 0 for bf16
  std::size_t w2_scale_bytes = 0;
};

// Validates every argument (hmoe::Error naming it) and resolves the defaults. Touches no device.
EpConfig make_ep_config(const MoeSpec& spec, int rank, int world_size, const EpOptions& options);

// The local runner's plan options: one row per received pair.
PlanOptions local_plan_options(const EpConfig& config);

// Byte offsets into the caller's workspace, each region 256-byte aligned.
struct EpWorkspaceLayout {
  std::size_t topk_ids = 0;         // [P] int32: routing output (run_from_logits)
  std::size_t topk_weights = 0;     // [P] fp32
  std::size_t chunk_bases = 0;      // [plan chunks, R] int32: per-chunk destination counts, then bases
  std::size_t exchange_counts = 0;  // [2R] int32: send counts, then received counts (one copy to the host)
  std::size_t valid_rows = 0;       // [1] int32: rows this rank sends
  std::size_t pair_rows = 0;        // [P] int32: send row of each pair, -1 for an invalid id
  std::size_t send_tokens = 0;      // [P] int32: token of each send row
  std::size_t send_ids = 0;         // [P] int32: local expert id on the destination
  std::size_t send_weights = 0;     // [P] fp32
  // [P, H] bf16: the packed x rows (FP8 dispatch: e4m3 [P, H] at its start), then — the dispatch
  // exchange being over — the results that come back, in send order.
  std::size_t send_rows = 0;
  std::size_t send_scales = 0;      // [P, H/128] fp32, FP8 dispatch only
  std::size_t recv_ids = 0;         // [max_recv_rows] int32
  std::size_t recv_weights = 0;     // [max_recv_rows] fp32
  std::size_t recv_fp8_rows = 0;    // [max_recv_rows, H] e4m3, FP8 dispatch only
  std::size_t recv_scales = 0;      // [max_recv_rows, H/128] fp32, FP8 dispatch only
  std::size_t recv_rows = 0;        // [max_recv_rows, H] bf16: received x, then the local output (in place)
  std::size_t runner = 0;           // the local MoeRunner's workspace
  std::size_t total = 0;
};
// Pairs per block of the device plan; the layout sizes chunk_bases with it.
inline constexpr int kPlanChunkPairs = 256;
int plan_chunks(int pairs);
EpWorkspaceLayout ep_workspace_layout(const EpConfig& config, std::size_t runner_workspace_bytes);

// Checks a run's arguments before anything is enqueued (a rejected call must not leave the peers
// waiting inside an exchange). workspace_bytes: EpMoeLayer::workspace_bytes().
void check_run_args(const EpConfig& config, std::size_t workspace_bytes, const EpRunArgs& args);
// Routing inputs of run_from_topk / run_from_logits, as device pointers of [T, k] / [T, E].
void check_topk_args(const EpConfig& config, const EpRunArgs& args, std::size_t workspace_bytes,
                     const void* topk_ids, const void* topk_weights);
void check_logits_args(const EpConfig& config, const EpRunArgs& args, std::size_t workspace_bytes,
                       const void* router_logits);

}  // namespace hmoe::ep
