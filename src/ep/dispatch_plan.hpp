// The index logic of expert parallelism on the host: which rank each (token, slot) pair goes to,
// where it sits in the send buffer, where received rows land and how results find their way back.
// It is the contract the device plan (dispatch_kernels.cu) reproduces exactly, and what the CPU
// tests and the CPU simulation of the whole layer run on.
#pragma once

#include <cstdint>
#include <vector>

namespace hmoe::ep {

// The rank owning `expert` when E experts are split into world_size equal contiguous shards;
// -1 for an id outside [0, E). Assumes E % world_size == 0 (checked where the layer is built).
int owner_rank(std::int32_t expert, int num_experts, int world_size);
// `expert`'s index among its owner's experts; -1 for an id outside [0, E).
int local_expert_id(std::int32_t expert, int num_experts, int world_size);

// counts [n] → offsets [n + 1]: offsets[i] = Σ_{j<i} counts[j], offsets[n] the total.
std::vector<int> exclusive_offsets(const std::vector<int>& counts);

// One rank's dispatch. Send rows are grouped by destination rank (rank 0's first) and, inside a
// destination, follow the (token, slot) order of the pairs: a stable sort by destination. Pair
// p = t·k + j is (token t, slot j).
struct DispatchPlan {
  int num_tokens = 0;
  int top_k = 0;
  int world_size = 0;
  std::vector<int> send_counts;            // [R]: rows for each destination rank
  std::vector<int> send_offsets;           // [R + 1]: first send row of each destination
  std::vector<int> pair_rows;              // [T·k]: send row of each pair, -1 for an invalid id
  std::vector<int> send_pairs;             // [rows]: the pair of each send row (inverse of pair_rows)
  std::vector<std::int32_t> send_local_ids;  // [rows]: the expert id on the destination rank
  std::vector<float> send_weights;         // [rows]: the pair's routing weight
  int invalid_pairs = 0;                   // pairs with an id outside [0, E): sent nowhere

  int send_rows() const { return send_offsets.empty() ? 0 : send_offsets.back(); }
  int send_token(int row) const { return send_pairs[row] / top_k; }
};

// topk_ids / topk_weights: [T, k]. Throws hmoe::Error on a bad size argument.
DispatchPlan plan_dispatch(const std::int32_t* topk_ids, const float* topk_weights, int num_tokens, int top_k,
                           int num_experts, int world_size);

// One rank's receive side once the counts are exchanged: recv_counts[q] = the rows rank q sends
// here (q's send_counts[this rank]); rows from q land at [recv_offsets[q], recv_offsets[q+1]), in
// q's send order, and go back to q from the same place after the local experts ran.
struct ReceivePlan {
  std::vector<int> recv_counts;            // [R]
  std::vector<int> recv_offsets;           // [R + 1]
  int total_rows() const { return recv_offsets.empty() ? 0 : recv_offsets.back(); }
};
ReceivePlan plan_receive(const std::vector<int>& recv_counts);

// The count exchange of all R ranks at once (what the NCCL group computes, for the simulation and
// the tests): result[r][q] = plans[q].send_counts[r].
std::vector<std::vector<int>> exchange_counts(const std::vector<DispatchPlan>& plans);

}  // namespace hmoe::ep
