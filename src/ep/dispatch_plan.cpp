// Host index logic of the expert-parallel layer (see dispatch_plan.hpp): plain loops, no CUDA.
#include "ep/dispatch_plan.hpp"

#include <climits>
#include <string>

#include "hmoe/hmoe.hpp"

namespace hmoe::ep {
namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("hmoe::ep: " + what); }

}  // namespace

int owner_rank(std::int32_t expert, int num_experts, int world_size) {
  if (expert < 0 || expert >= num_experts) return -1;
  return expert / (num_experts / world_size);
}

int local_expert_id(std::int32_t expert, int num_experts, int world_size) {
  if (expert < 0 || expert >= num_experts) return -1;
  return expert % (num_experts / world_size);
}

std::vector<int> exclusive_offsets(const std::vector<int>& counts) {
  std::vector<int> offsets(counts.size() + 1, 0);
  long long running = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0) fail("counts[" + std::to_string(i) + "] = " + std::to_string(counts[i]) + ": expected ≥ 0");
    running += counts[i];
    if (running > INT_MAX) fail("row counts sum past " + std::to_string(INT_MAX));
    offsets[i + 1] = static_cast<int>(running);
  }
  return offsets;
}

DispatchPlan plan_dispatch(const std::int32_t* topk_ids, const float* topk_weights, int num_tokens, int top_k,
                           int num_experts, int world_size) {
  if (num_tokens < 0) fail("num_tokens = " + std::to_string(num_tokens) + ": expected ≥ 0");
  if (top_k < 1) fail("top_k = " + std::to_string(top_k) + ": expected ≥ 1");
  if (world_size < 1 || num_experts < 1 || num_experts % world_size != 0)
    fail("world_size = " + std::to_string(world_size) + ": expected a divisor of num_experts = " +
         std::to_string(num_experts));
  const long long pairs = static_cast<long long>(num_tokens) * top_k;
  if (pairs > INT_MAX)
    fail("num_tokens × top_k = " + std::to_string(pairs) + ": expected ≤ " + std::to_string(INT_MAX));

  DispatchPlan plan;
  plan.num_tokens = num_tokens;
  plan.top_k = top_k;
  plan.world_size = world_size;
  plan.send_counts.assign(world_size, 0);
  plan.pair_rows.assign(pairs, -1);
  for (long long p = 0; p < pairs; ++p) {
    const int rank = owner_rank(topk_ids[p], num_experts, world_size);
    if (rank < 0)
      ++plan.invalid_pairs;
    else
      ++plan.send_counts[rank];
  }
  plan.send_offsets = exclusive_offsets(plan.send_counts);

  // A counting sort: each destination's cursor walks its rows in pair order, so the sort is stable.
  std::vector<int> cursor(plan.send_offsets.begin(), plan.send_offsets.end() - 1);
  const int rows = plan.send_rows();
  plan.send_pairs.assign(rows, -1);
  plan.send_local_ids.assign(rows, -1);
  plan.send_weights.assign(rows, 0.0f);
  for (long long p = 0; p < pairs; ++p) {
    const int rank = owner_rank(topk_ids[p], num_experts, world_size);
    if (rank < 0) continue;
    const int row = cursor[rank]++;
    plan.pair_rows[p] = row;
    plan.send_pairs[row] = static_cast<int>(p);
    plan.send_local_ids[row] = local_expert_id(topk_ids[p], num_experts, world_size);
    plan.send_weights[row] = topk_weights[p];
  }
  return plan;
}

ReceivePlan plan_receive(const std::vector<int>& recv_counts) {
  ReceivePlan plan;
  plan.recv_counts = recv_counts;
  plan.recv_offsets = exclusive_offsets(recv_counts);
  return plan;
}

std::vector<std::vector<int>> exchange_counts(const std::vector<DispatchPlan>& plans) {
  const int world_size = static_cast<int>(plans.size());
  std::vector<std::vector<int>> received(world_size, std::vector<int>(world_size, 0));
  for (int q = 0; q < world_size; ++q) {
    if (static_cast<int>(plans[q].send_counts.size()) != world_size)
      fail("plans[" + std::to_string(q) + "] has " + std::to_string(plans[q].send_counts.size()) +
           " send counts: expected world_size = " + std::to_string(world_size));
    for (int r = 0; r < world_size; ++r) received[r][q] = plans[q].send_counts[r];
  }
  return received;
}

}  // namespace hmoe::ep
