// Reference routing: softmax top-k and DeepSeek-V3 grouped sigmoid top-k, in float64.
// Every selection orders by (score descending, index ascending), so exact ties pick the lower index.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "reference/reference.hpp"

namespace hmoe::reference {
namespace {

// The count best of candidates by score, best first; ties go to the lower index.
std::vector<int> best_by_score(std::vector<int> candidates, const std::vector<double>& score,
                               int count) {
  const auto better = [&](int a, int b) { return score[a] > score[b] || (score[a] == score[b] && a < b); };
  std::partial_sort(candidates.begin(), candidates.begin() + count, candidates.end(), better);
  candidates.resize(count);
  return candidates;
}

std::vector<int> all_indices(int count) {
  std::vector<int> indices(count);
  std::iota(indices.begin(), indices.end(), 0);
  return indices;
}

void route_softmax(const MoeSpec& spec, const float* logits, std::int32_t* ids, float* weights) {
  const int experts = spec.num_experts;
  const double max_logit = *std::max_element(logits, logits + experts);
  std::vector<double> probability(experts);
  double sum = 0.0;
  for (int e = 0; e < experts; ++e) sum += probability[e] = std::exp(double(logits[e]) - max_logit);
  for (double& p : probability) p /= sum;

  const std::vector<int> chosen = best_by_score(all_indices(experts), probability, spec.top_k);
  double chosen_sum = 0.0;
  for (int e : chosen) chosen_sum += probability[e];
  const double divisor = spec.routing.renormalize ? chosen_sum : 1.0;
  for (int j = 0; j < spec.top_k; ++j) {
    ids[j] = chosen[j];
    weights[j] = static_cast<float>(probability[chosen[j]] / divisor);
  }
}

void route_grouped(const MoeSpec& spec, const float* logits, const float* correction_bias,
                   std::int32_t* ids, float* weights) {
  const int experts = spec.num_experts;
  const int groups = spec.routing.num_groups;
  const int group_size = experts / groups;
  std::vector<double> sigmoid(experts), biased(experts);
  for (int e = 0; e < experts; ++e) {
    sigmoid[e] = 1.0 / (1.0 + std::exp(-double(logits[e])));
    biased[e] = sigmoid[e] + (correction_bias ? double(correction_bias[e]) : 0.0);
  }

  std::vector<double> group_score(groups);
  for (int g = 0; g < groups; ++g) {
    std::vector<int> members(group_size);
    std::iota(members.begin(), members.end(), g * group_size);
    const std::vector<int> top2 = best_by_score(members, biased, 2);
    group_score[g] = biased[top2[0]] + biased[top2[1]];
  }
  std::vector<int> candidates;
  for (int g : best_by_score(all_indices(groups), group_score, spec.routing.topk_groups)) {
    for (int e = g * group_size; e < (g + 1) * group_size; ++e) candidates.push_back(e);
  }

  const std::vector<int> chosen = best_by_score(candidates, biased, spec.top_k);
  double chosen_sum = 0.0;
  for (int e : chosen) chosen_sum += sigmoid[e];
  const double scale = double(spec.routing.routed_scaling_factor) / chosen_sum;
  for (int j = 0; j < spec.top_k; ++j) {
    ids[j] = chosen[j];
    weights[j] = static_cast<float>(sigmoid[chosen[j]] * scale);
  }
}

void check_routing_spec(const MoeSpec& spec) {
  const RoutingSpec& routing = spec.routing;
  if (spec.num_experts < 1 || spec.top_k < 1 || spec.top_k > spec.num_experts)
    throw Error("hmoe::reference::route: need 1 <= top_k = " + std::to_string(spec.top_k) +
                " <= num_experts = " + std::to_string(spec.num_experts));
  if (routing.function != RoutingFunction::kGroupedSigmoidTopK) return;
  const bool groups_valid = routing.num_groups >= 1 && spec.num_experts % routing.num_groups == 0 &&
                            spec.num_experts / routing.num_groups >= 2 && routing.topk_groups >= 1 &&
                            routing.topk_groups <= routing.num_groups &&
                            spec.top_k <= routing.topk_groups * (spec.num_experts / routing.num_groups);
  if (!groups_valid)
    throw Error("hmoe::reference::route: grouped routing needs num_groups dividing num_experts with "
                ">= 2 experts each and top_k <= topk_groups x group size; got num_groups = " +
                std::to_string(routing.num_groups) + ", topk_groups = " +
                std::to_string(routing.topk_groups));
}

}  // namespace

Routing route(const MoeSpec& spec, const float* logits, int num_tokens, const float* correction_bias) {
  check_routing_spec(spec);
  Routing routing;
  routing.num_tokens = num_tokens;
  routing.top_k = spec.top_k;
  routing.ids.resize(std::size_t(num_tokens) * spec.top_k);
  routing.weights.resize(routing.ids.size());
  for (int t = 0; t < num_tokens; ++t) {
    const float* token_logits = logits + std::size_t(t) * spec.num_experts;
    std::int32_t* ids = routing.ids.data() + std::size_t(t) * spec.top_k;
    float* weights = routing.weights.data() + std::size_t(t) * spec.top_k;
    if (spec.routing.function == RoutingFunction::kSoftmaxTopK)
      route_softmax(spec, token_logits, ids, weights);
    else
      route_grouped(spec, token_logits, correction_bias, ids, weights);
  }
  return routing;
}

}  // namespace hmoe::reference
