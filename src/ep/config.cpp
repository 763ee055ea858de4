// Validation, defaults and workspace layout of the expert-parallel layer: host only, no device.
#include "ep/config.hpp"

#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/arguments.hpp"

namespace hmoe {

ExpertShard expert_shard(int num_experts, int rank, int world_size) {
  if (num_experts < 1 || num_experts > kMaxExperts)
    throw Error("hmoe: invalid MoeSpec.num_experts = " + std::to_string(num_experts) + ": expected 1.." +
                std::to_string(kMaxExperts));
  if (world_size < 1 || world_size > num_experts)
    throw Error("hmoe: invalid EP world_size = " + std::to_string(world_size) + ": expected 1..num_experts=" +
                std::to_string(num_experts));
  if (num_experts % world_size != 0)
    throw Error("hmoe: invalid EP world_size = " + std::to_string(world_size) + ": expected a divisor of " +
                "MoeSpec.num_experts = " + std::to_string(num_experts) + " (every rank owns num_experts / world_size "
                "experts)");
  if (rank < 0 || rank >= world_size)
    throw Error("hmoe: invalid EP rank = " + std::to_string(rank) + ": expected 0..world_size-1 = " +
                std::to_string(world_size - 1));
  const int per_rank = num_experts / world_size;
  return ExpertShard{rank * per_rank, per_rank};
}

MoeSpec ep_local_spec(const MoeSpec& spec, int world_size) {
  validate(spec);
  expert_shard(spec.num_experts, 0, world_size);
  MoeSpec local = spec;
  local.num_experts = spec.num_experts / world_size;
  local.top_k = 1;
  // NOTE: the expert ranks run from received ids, never route; a default routing keeps the local
  // spec valid for any E / R (grouped routing needs num_experts divisible by its groups).
  local.routing = RoutingSpec{};
  return local;
}

namespace ep {
namespace {

constexpr std::size_t kAlignment = 256;

std::size_t align_up(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

using arguments::Buffer;
using arguments::require_alignment;
using arguments::require_pointer;

// The workspace and out are written: neither may overlap another buffer, except out == x exactly
// (in place: x is packed into the workspace before out is written).
void require_disjoint(std::initializer_list<Buffer> list) {
  arguments::require_disjoint(list, "EpRunArgs.out", "EpRunArgs.x");
}

std::size_t row_bytes(const EpConfig& config) { return static_cast<std::size_t>(config.spec.hidden) * 2; }

}  // namespace

EpConfig make_ep_config(const MoeSpec& spec, int rank, int world_size, const EpOptions& options) {
  validate(spec);
  EpConfig config;
  config.spec = spec;
  config.shard = expert_shard(spec.num_experts, rank, world_size);
  config.local_spec = ep_local_spec(spec, world_size);
  config.rank = rank;
  config.world_size = world_size;
  config.options = options;

  if (options.max_tokens_per_rank < 1 || options.max_tokens_per_rank > kMaxRows)
    throw Error("hmoe: invalid EpOptions.max_tokens_per_rank = " + std::to_string(options.max_tokens_per_rank) +
                ": expected 1.." + std::to_string(kMaxRows));
  const int dtype = static_cast<int>(options.dispatch_dtype);
  if (dtype < static_cast<int>(EpDispatchDType::kBF16) || dtype > static_cast<int>(EpDispatchDType::kFP8Block128))
    throw Error("hmoe: invalid EpOptions.dispatch_dtype = " + std::to_string(dtype) +
                ": expected 0 (bf16) or 1 (fp8 1x128 blocks)");
  config.fp8_dispatch = options.dispatch_dtype == EpDispatchDType::kFP8Block128;
  if (config.fp8_dispatch && spec.hidden % kDispatchGroup != 0)
    throw Error("hmoe: invalid EpOptions.dispatch_dtype = fp8 1x128 blocks with MoeSpec.hidden = " +
                std::to_string(spec.hidden) + ": expected hidden a multiple of 128");
  config.dispatch_groups = config.fp8_dispatch ? spec.hidden / kDispatchGroup : 0;
  config.max_pairs = options.max_tokens_per_rank * spec.top_k;

  const long long worst_case = static_cast<long long>(world_size) * config.max_pairs;
  if (options.max_recv_rows < 0 || options.max_recv_rows > kMaxRows)
    throw Error("hmoe: invalid EpOptions.max_recv_rows = " + std::to_string(options.max_recv_rows) +
                ": expected 0 (world_size × max_tokens_per_rank × top_k) or 1.." + std::to_string(kMaxRows));
  if (options.max_recv_rows == 0 && worst_case > kMaxRows)
    throw Error("hmoe: invalid EpOptions.max_recv_rows = 0: its default world_size × max_tokens_per_rank × top_k = " +
                std::to_string(worst_case) + " rows exceeds the local runner's " + std::to_string(kMaxRows) +
                ": set max_recv_rows to the most rows one rank may receive");
  config.max_recv_rows = options.max_recv_rows > 0 ? options.max_recv_rows : static_cast<int>(worst_case);
  config.w13_scale_bytes = weight_scale_count(config.local_spec, WeightMatrix::kW13) * sizeof(float);
  config.w2_scale_bytes = weight_scale_count(config.local_spec, WeightMatrix::kW2) * sizeof(float);
  return config;
}

PlanOptions local_plan_options(const EpConfig& config) {
  PlanOptions plan;
  plan.max_tokens = config.max_recv_rows;
  plan.orientation = config.options.orientation;
  plan.max_workspace_bytes = config.options.max_local_workspace_bytes;
  return plan;
}

int plan_chunks(int pairs) { return (pairs + kPlanChunkPairs - 1) / kPlanChunkPairs; }

EpWorkspaceLayout ep_workspace_layout(const EpConfig& config, std::size_t runner_workspace_bytes) {
  const std::size_t pairs = config.max_pairs;
  const std::size_t recv = config.max_recv_rows;
  const std::size_t ranks = config.world_size;
  const std::size_t hidden = config.spec.hidden;
  const std::size_t groups = config.dispatch_groups;
  EpWorkspaceLayout layout;
  std::size_t offset = 0;
  const auto take = [&](std::size_t bytes) {
    const std::size_t start = offset;
    offset += align_up(bytes);
    return start;
  };
  layout.topk_ids = take(pairs * 4);
  layout.topk_weights = take(pairs * 4);
  layout.chunk_bases = take(static_cast<std::size_t>(plan_chunks(config.max_pairs)) * ranks * 4);
  layout.exchange_counts = take(2 * ranks * 4);
  layout.valid_rows = take(4);
  layout.pair_rows = take(pairs * 4);
  layout.send_tokens = take(pairs * 4);
  layout.send_ids = take(pairs * 4);
  layout.send_weights = take(pairs * 4);
  layout.send_rows = take(pairs * hidden * 2);
  layout.send_scales = config.fp8_dispatch ? take(pairs * groups * 4) : 0;
  layout.recv_ids = take(recv * 4);
  layout.recv_weights = take(recv * 4);
  layout.recv_fp8_rows = config.fp8_dispatch ? take(recv * hidden) : 0;
  layout.recv_scales = config.fp8_dispatch ? take(recv * groups * 4) : 0;
  layout.recv_rows = take(recv * hidden * 2);
  layout.runner = take(runner_workspace_bytes);
  layout.total = offset;
  return layout;
}

void check_run_args(const EpConfig& config, std::size_t workspace_bytes, const EpRunArgs& args) {
  if (args.num_tokens < 0 || args.num_tokens > config.options.max_tokens_per_rank)
    throw Error("hmoe: EpRunArgs.num_tokens = " + std::to_string(args.num_tokens) +
                ": expected 0..EpOptions.max_tokens_per_rank=" + std::to_string(config.options.max_tokens_per_rank));
  // x and out are touched only when this rank has tokens; the weights and the workspace always
  // (other ranks may send rows here).
  if (args.num_tokens > 0) {
    require_pointer(args.x, "EpRunArgs.x", 16);
    require_pointer(args.out, "EpRunArgs.out", 16);
  }
  require_pointer(args.weights.w13, "EpRunArgs.weights.w13", 16);
  require_pointer(args.weights.w2, "EpRunArgs.weights.w2", 16);
  require_alignment(args.weights.correction_bias, "EpRunArgs.weights.correction_bias", 4);
  require_alignment(args.invalid_id_count, "EpRunArgs.invalid_id_count", 4);
  require_pointer(args.workspace, "EpRunArgs.workspace", 256);
  arguments::require_fp8_arguments(config.spec, args.weights, args.act_scale, args.intermediate_act_scale,
                                   {"EpRunArgs", "EpRunArgs.weights.w13_scale", "EpRunArgs.weights.w2_scale",
                                    "EpRunArgs.act_scale", "EpRunArgs.intermediate_act_scale"});
  if (args.workspace_size < workspace_bytes)
    throw Error("hmoe: EpRunArgs.workspace_size = " + std::to_string(args.workspace_size) + ": expected at least " +
                std::to_string(workspace_bytes) + " (EpMoeLayer::workspace_bytes())");
}

void check_topk_args(const EpConfig& config, const EpRunArgs& args, std::size_t workspace_bytes,
                     const void* topk_ids, const void* topk_weights) {
  check_run_args(config, workspace_bytes, args);
  if (args.num_tokens > 0) {
    require_pointer(topk_ids, "topk_ids", 4);
    require_pointer(topk_weights, "topk_weights", 4);
  }
  const std::size_t tokens = args.num_tokens;
  const std::size_t slot_bytes = static_cast<std::size_t>(config.spec.top_k) * 4;
  require_disjoint({{"EpRunArgs.workspace", args.workspace, workspace_bytes},
                    {"EpRunArgs.out", args.out, tokens * row_bytes(config)},
                    {"EpRunArgs.x", args.x, tokens * row_bytes(config)},
                    {"topk_ids", topk_ids, tokens * slot_bytes},
                    {"topk_weights", topk_weights, tokens * slot_bytes},
                    {"EpRunArgs.invalid_id_count", args.invalid_id_count, 4},
                    {"EpRunArgs.weights.w13_scale", args.weights.w13_scale,
                     config.w13_scale_bytes},
                    {"EpRunArgs.weights.w2_scale", args.weights.w2_scale,
                     config.w2_scale_bytes},
                    {"EpRunArgs.act_scale", args.act_scale, 4},
                    {"EpRunArgs.intermediate_act_scale", args.intermediate_act_scale, 4}});
}

void check_logits_args(const EpConfig& config, const EpRunArgs& args, std::size_t workspace_bytes,
                       const void* router_logits) {
  check_run_args(config, workspace_bytes, args);
  const std::size_t logit_bytes = config.spec.routing.logits_dtype == LogitsDType::kBFloat16 ? 2 : 4;
  if (args.num_tokens > 0) require_pointer(router_logits, "router_logits", logit_bytes);
  const std::size_t tokens = args.num_tokens;
  const bool grouped = config.spec.routing.function == RoutingFunction::kGroupedSigmoidTopK;
  require_disjoint({{"EpRunArgs.workspace", args.workspace, workspace_bytes},
                    {"EpRunArgs.out", args.out, tokens * row_bytes(config)},
                    {"EpRunArgs.x", args.x, tokens * row_bytes(config)},
                    {"router_logits", router_logits, tokens * config.spec.num_experts * logit_bytes},
                    {"EpRunArgs.weights.correction_bias", grouped ? args.weights.correction_bias : nullptr,
                     static_cast<std::size_t>(config.spec.num_experts) * 4},
                    {"EpRunArgs.invalid_id_count", args.invalid_id_count, 4},
                    {"EpRunArgs.weights.w13_scale", args.weights.w13_scale,
                     config.w13_scale_bytes},
                    {"EpRunArgs.weights.w2_scale", args.weights.w2_scale,
                     config.w2_scale_bytes},
                    {"EpRunArgs.act_scale", args.act_scale, 4},
                    {"EpRunArgs.intermediate_act_scale", args.intermediate_act_scale, 4}});
}

}  // namespace ep
}  // namespace hmoe
