// Expert parallelism without a GPU: the sharding, the dispatch plan against a brute-force
// definition (exhaustively on small cases, by invariants on DeepSeek-V3-sized ones), the count
// exchange, configuration and argument checks, and a CPU simulation of the whole layer for R ranks
// (all-to-alls as vector copies, experts on the float64 reference) that must equal the single layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ep/config.hpp"
#include "ep/dispatch_plan.hpp"
#include "ep/fp8_dispatch_reference.hpp"
#include "hmoe/ep.hpp"
#include "hmoe/hmoe.hpp"
#include "reference/reference.hpp"

namespace hmoe::test {
namespace {

using ep::DispatchPlan;

std::string error_of(const auto& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

#define EXPECT_ERROR_MENTIONS(call, text)                                      \
  do {                                                                         \
    const std::string message_ = error_of([&] { call; });                      \
    EXPECT_NE(message_.find(text), std::string::npos)                          \
        << "expected an hmoe::Error mentioning '" << (text) << "', got '" << message_ << "'"; \
  } while (0)

std::vector<int> divisors(int n) {
  std::vector<int> result;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) result.push_back(d);
  return result;
}

// ---- Sharding --------------------------------------------------------------------------------

TEST(EpSharding, EveryExpertHasExactlyOneOwnerAndLocalId) {
  for (int experts = 1; experts <= 72; ++experts) {
    for (int world : divisors(experts)) {
      std::vector<int> owned(experts, 0);
      for (int rank = 0; rank < world; ++rank) {
        const ExpertShard shard = expert_shard(experts, rank, world);
        ASSERT_EQ(shard.num_experts, experts / world);
        ASSERT_EQ(shard.first_expert, rank * (experts / world));
        for (int e = shard.first_expert; e < shard.first_expert + shard.num_experts; ++e) {
          ++owned[e];
          ASSERT_EQ(ep::owner_rank(e, experts, world), rank) << "E=" << experts << " R=" << world << " e=" << e;
          ASSERT_EQ(ep::local_expert_id(e, experts, world), e - shard.first_expert);
        }
      }
      for (int e = 0; e < experts; ++e) ASSERT_EQ(owned[e], 1) << "E=" << experts << " R=" << world << " e=" << e;
      for (std::int32_t bad : {INT_MIN, -1000, -2, -1, experts, experts + 1, experts * 2, INT_MAX}) {
        EXPECT_EQ(ep::owner_rank(bad, experts, world), -1) << bad;
        EXPECT_EQ(ep::local_expert_id(bad, experts, world), -1) << bad;
      }
    }
  }
}

TEST(EpSharding, BadArgumentsAreNamed) {
  EXPECT_ERROR_MENTIONS(expert_shard(256, 0, 3), "world_size = 3: expected a divisor of MoeSpec.num_experts = 256");
  EXPECT_ERROR_MENTIONS(expert_shard(256, 0, 0), "world_size = 0");
  EXPECT_ERROR_MENTIONS(expert_shard(8, 0, 16), "world_size = 16");
  EXPECT_ERROR_MENTIONS(expert_shard(256, 8, 8), "rank = 8: expected 0..world_size-1 = 7");
  EXPECT_ERROR_MENTIONS(expert_shard(256, -1, 8), "rank = -1");
  EXPECT_ERROR_MENTIONS(expert_shard(0, 0, 1), "num_experts = 0");
}

TEST(EpSharding, LocalSpecHasTheShardsExpertsAndOneSlot) {
  const MoeSpec deepseek = preset("deepseek-v3-tp8");
  for (int world : {1, 2, 4, 8, 16, 32, 64, 128}) {
    const MoeSpec local = ep_local_spec(deepseek, world);
    EXPECT_EQ(local.num_experts, 256 / world);
    EXPECT_EQ(local.top_k, 1);
    EXPECT_EQ(local.hidden, deepseek.hidden);
    EXPECT_EQ(local.intermediate, deepseek.intermediate);
    EXPECT_EQ(local.routing.function, RoutingFunction::kSoftmaxTopK);  // never routes; any E / R stays valid
    EXPECT_NO_THROW(validate(local));
  }
  MoeSpec fp8 = deepseek;
  fp8.weight_dtype = WeightDType::kFP8E4M3;
  fp8.scheme = QuantScheme::kBlock128;
  fp8.ue8m0_scales = true;
  const MoeSpec local = ep_local_spec(fp8, 8);
  EXPECT_EQ(local.scheme, QuantScheme::kBlock128);
  EXPECT_TRUE(local.ue8m0_scales);
  EXPECT_EQ(prepared_w13_bytes(local) * 8, prepared_w13_bytes(fp8));
  EXPECT_EQ(weight_scale_count(local, WeightMatrix::kW13) * 8, weight_scale_count(fp8, WeightMatrix::kW13));
  EXPECT_ERROR_MENTIONS(ep_local_spec(deepseek, 3), "world_size = 3");
  EXPECT_ERROR_MENTIONS(ep_local_spec(preset("mixtral-8x7b"), 16), "world_size = 16");
}

// ---- The dispatch plan ---------------------------------------------------------------------

// The definition: valid pairs sorted by (destination rank, pair index).
DispatchPlan brute_force_plan(const std::vector<std::int32_t>& ids, const std::vector<float>& weights, int tokens,
                              int top_k, int experts, int world) {
  DispatchPlan plan;
  plan.num_tokens = tokens;
  plan.top_k = top_k;
  plan.world_size = world;
  plan.send_counts.assign(world, 0);
  plan.pair_rows.assign(ids.size(), -1);
  std::vector<std::pair<int, int>> keyed;  // (rank, pair)
  const int per_rank = experts / world;
  for (int p = 0; p < static_cast<int>(ids.size()); ++p) {
    if (ids[p] < 0 || ids[p] >= experts) {
      ++plan.invalid_pairs;
      continue;
    }
    keyed.emplace_back(ids[p] / per_rank, p);
    ++plan.send_counts[ids[p] / per_rank];
  }
  std::sort(keyed.begin(), keyed.end());
  plan.send_offsets.assign(world + 1, 0);
  for (int r = 0; r < world; ++r) plan.send_offsets[r + 1] = plan.send_offsets[r] + plan.send_counts[r];
  for (int row = 0; row < static_cast<int>(keyed.size()); ++row) {
    const int p = keyed[row].second;
    plan.pair_rows[p] = row;
    plan.send_pairs.push_back(p);
    plan.send_local_ids.push_back(ids[p] % per_rank);
    plan.send_weights.push_back(weights[p]);
  }
  return plan;
}

void expect_same_plan(const DispatchPlan& expected, const DispatchPlan& actual, const std::string& what) {
  EXPECT_EQ(actual.send_counts, expected.send_counts) << what;
  EXPECT_EQ(actual.send_offsets, expected.send_offsets) << what;
  EXPECT_EQ(actual.pair_rows, expected.pair_rows) << what;
  EXPECT_EQ(actual.send_pairs, expected.send_pairs) << what;
  EXPECT_EQ(actual.send_local_ids, expected.send_local_ids) << what;
  EXPECT_EQ(actual.send_weights, expected.send_weights) << what;
  EXPECT_EQ(actual.invalid_pairs, expected.invalid_pairs) << what;
}

// Invariants any plan must satisfy, independent of how it was built.
void expect_consistent_plan(const DispatchPlan& plan, const std::vector<std::int32_t>& ids,
                            const std::vector<float>& weights, int experts, const std::string& what) {
  const int world = plan.world_size, pairs = static_cast<int>(ids.size());
  ASSERT_EQ(static_cast<int>(plan.send_counts.size()), world) << what;
  ASSERT_EQ(static_cast<int>(plan.send_offsets.size()), world + 1) << what;
  ASSERT_EQ(plan.send_offsets[0], 0) << what;
  for (int r = 0; r < world; ++r) ASSERT_EQ(plan.send_offsets[r + 1] - plan.send_offsets[r], plan.send_counts[r]);
  ASSERT_EQ(plan.send_rows() + plan.invalid_pairs, pairs) << what;
  ASSERT_EQ(static_cast<int>(plan.send_pairs.size()), plan.send_rows()) << what;
  for (int p = 0; p < pairs; ++p) {
    const int rank = ep::owner_rank(ids[p], experts, world);
    const int row = plan.pair_rows[p];
    if (rank < 0) {
      ASSERT_EQ(row, -1) << what << " pair " << p;
      continue;
    }
    ASSERT_GE(row, plan.send_offsets[rank]) << what << " pair " << p;
    ASSERT_LT(row, plan.send_offsets[rank + 1]) << what << " pair " << p;
    ASSERT_EQ(plan.send_pairs[row], p) << what;  // pair_rows and send_pairs are inverse maps
    ASSERT_EQ(plan.send_token(row), p / plan.top_k);
    ASSERT_EQ(plan.send_local_ids[row], ep::local_expert_id(ids[p], experts, world));
    ASSERT_EQ(plan.send_weights[row], weights[p]);
  }
  for (int r = 0; r < world; ++r)
    for (int row = plan.send_offsets[r] + 1; row < plan.send_offsets[r + 1]; ++row)
      ASSERT_LT(plan.send_pairs[row - 1], plan.send_pairs[row]) << what << ": stable order inside rank " << r;
}

TEST(EpDispatchPlan, ExhaustiveSmallCasesMatchTheDefinition) {
  // Every assignment of ids in {-1, 0..4} (4 = E, invalid) to T = 2 tokens × k = 2 slots, E = 4.
  const int tokens = 2, top_k = 2, experts = 4, pairs = tokens * top_k;
  const std::vector<float> weights = {0.5f, 0.25f, 0.125f, 1.0f};
  int cases = 0;
  for (int world : {1, 2, 4}) {
    for (int code = 0; code < 6 * 6 * 6 * 6; ++code) {
      std::vector<std::int32_t> ids(pairs);
      for (int p = 0, rest = code; p < pairs; ++p, rest /= 6) ids[p] = rest % 6 - 1;
      const DispatchPlan plan = ep::plan_dispatch(ids.data(), weights.data(), tokens, top_k, experts, world);
      const std::string what = "R=" + std::to_string(world) + " ids code " + std::to_string(code);
      expect_same_plan(brute_force_plan(ids, weights, tokens, top_k, experts, world), plan, what);
      expect_consistent_plan(plan, ids, weights, experts, what);
      ++cases;
    }
  }
  std::cout << "  " << cases << " plans equal the brute-force definition\n";
}

// Routing draws over E experts: distinct experts per token, weights in (0.1, 1).
struct Draw {
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
};

Draw uniform_draw(int tokens, int top_k, int experts, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  Draw draw;
  std::vector<int> order(experts);
  for (int t = 0; t < tokens; ++t) {
    std::iota(order.begin(), order.end(), 0);
    for (int j = 0; j < top_k; ++j) {
      std::swap(order[j], order[j + rng() % (experts - j)]);
      draw.ids.push_back(order[j]);
      draw.weights.push_back(weight(rng));
    }
  }
  return draw;
}

// Every token's k experts inside one rank's shard.
Draw one_rank_draw(int tokens, int top_k, int experts, int world, int rank, std::uint64_t seed) {
  Draw draw = uniform_draw(tokens, top_k, experts / world, seed);
  for (std::int32_t& id : draw.ids) id += rank * (experts / world);
  return draw;
}

// Every token to the same k experts (DESIGN.md's extreme routing).
Draw extreme_draw(int tokens, int top_k, std::uint64_t seed) {
  Draw draw = uniform_draw(tokens, top_k, top_k, seed);
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < top_k; ++j) draw.ids[t * top_k + j] = 3 * j;
  return draw;
}

// Every `period`-th slot gets an id outside [0, E).
void make_some_invalid(Draw& draw, int experts, int period) {
  const std::int32_t bad[] = {-1, experts, INT_MIN, experts + 77, INT_MAX, -5};
  for (std::size_t i = 0; i < draw.ids.size(); i += period) draw.ids[i] = bad[(i / period) % 6];
}

TEST(EpDispatchPlan, DeepSeekV3ShapesKeepEveryInvariant) {
  const int experts = 256, top_k = 8;
  for (int world : {1, 2, 4, 8}) {
    for (int tokens : {0, 1, 2, 7, 64, 1000, 4096}) {
      Draw draw = uniform_draw(tokens, top_k, experts, 1000 + tokens + world);
      if (tokens % 2 == 1) make_some_invalid(draw, experts, 5);
      const DispatchPlan plan = ep::plan_dispatch(draw.ids.data(), draw.weights.data(), tokens, top_k, experts, world);
      const std::string what = "R=" + std::to_string(world) + " T=" + std::to_string(tokens);
      expect_consistent_plan(plan, draw.ids, draw.weights, experts, what);
      expect_same_plan(brute_force_plan(draw.ids, draw.weights, tokens, top_k, experts, world), plan, what);
    }
  }
}

TEST(EpDispatchPlan, SkewedAndExtremeRouting) {
  const int experts = 256, top_k = 8, tokens = 512;
  for (int world : {2, 4, 8}) {
    for (int target = 0; target < world; ++target) {
      const Draw draw = one_rank_draw(tokens, top_k, experts, world, target, 7 + target);
      const DispatchPlan plan = ep::plan_dispatch(draw.ids.data(), draw.weights.data(), tokens, top_k, experts, world);
      for (int r = 0; r < world; ++r) EXPECT_EQ(plan.send_counts[r], r == target ? tokens * top_k : 0) << r;
      // All pairs go to one rank, in pair order: the plan is the identity permutation.
      for (int p = 0; p < tokens * top_k; ++p) ASSERT_EQ(plan.pair_rows[p], p);
      expect_consistent_plan(plan, draw.ids, draw.weights, experts, "one rank");
    }
    const Draw draw = extreme_draw(tokens, top_k, 3);
    const DispatchPlan plan = ep::plan_dispatch(draw.ids.data(), draw.weights.data(), tokens, top_k, experts, world);
    expect_consistent_plan(plan, draw.ids, draw.weights, experts, "extreme");
    expect_same_plan(brute_force_plan(draw.ids, draw.weights, tokens, top_k, experts, world), plan, "extreme");
  }
}

TEST(EpDispatchPlan, InvalidIdsAreSentNowhere) {
  const int experts = 256, top_k = 8, tokens = 64;
  Draw draw = uniform_draw(tokens, top_k, experts, 11);
  make_some_invalid(draw, experts, 3);
  const DispatchPlan plan = ep::plan_dispatch(draw.ids.data(), draw.weights.data(), tokens, top_k, experts, 4);
  int invalid = 0;
  for (std::size_t p = 0; p < draw.ids.size(); ++p) {
    if (draw.ids[p] < 0 || draw.ids[p] >= experts) {
      ++invalid;
      EXPECT_EQ(plan.pair_rows[p], -1);
    }
  }
  EXPECT_EQ(plan.invalid_pairs, invalid);
  EXPECT_EQ(plan.send_rows(), tokens * top_k - invalid);

  std::vector<std::int32_t> all_bad(tokens * top_k, -1);
  const DispatchPlan nothing = ep::plan_dispatch(all_bad.data(), draw.weights.data(), tokens, top_k, experts, 4);
  EXPECT_EQ(nothing.send_rows(), 0);
  EXPECT_EQ(nothing.invalid_pairs, tokens * top_k);
  EXPECT_EQ(nothing.send_counts, std::vector<int>(4, 0));
}

TEST(EpDispatchPlan, BadSizesAreNamed) {
  const std::int32_t id = 0;
  const float weight = 1.0f;
  EXPECT_ERROR_MENTIONS(ep::plan_dispatch(&id, &weight, -1, 1, 8, 2), "num_tokens = -1");
  EXPECT_ERROR_MENTIONS(ep::plan_dispatch(&id, &weight, 1, 0, 8, 2), "top_k = 0");
  EXPECT_ERROR_MENTIONS(ep::plan_dispatch(&id, &weight, 1, 1, 8, 3), "world_size = 3");
}

// ---- The count exchange and the receive side ------------------------------------------------

TEST(EpExchange, ReceiveOffsetsFollowTheExchangedCounts) {
  const int experts = 256, top_k = 8;
  for (int world : {1, 2, 4, 8}) {
    std::vector<DispatchPlan> plans;
    std::vector<Draw> draws;
    for (int r = 0; r < world; ++r) {
      const int tokens = (r * 37) % 100;  // different T per rank, rank 0 has none
      draws.push_back(r % 3 == 2 ? one_rank_draw(tokens, top_k, experts, world, world - 1, r)
                                 : uniform_draw(tokens, top_k, experts, 50 + r));
      if (r % 2 == 1) make_some_invalid(draws.back(), experts, 7);
      plans.push_back(ep::plan_dispatch(draws[r].ids.data(), draws[r].weights.data(), tokens, top_k, experts, world));
    }
    const std::vector<std::vector<int>> received = ep::exchange_counts(plans);
    long long sent_total = 0, received_total = 0;
    for (int r = 0; r < world; ++r) {
      sent_total += plans[r].send_rows();
      const ep::ReceivePlan receive = ep::plan_receive(received[r]);
      received_total += receive.total_rows();
      ASSERT_EQ(static_cast<int>(receive.recv_offsets.size()), world + 1);
      EXPECT_EQ(receive.recv_offsets[0], 0);
      for (int q = 0; q < world; ++q) {
        EXPECT_EQ(receive.recv_counts[q], plans[q].send_counts[r]) << "rank " << r << " from " << q;
        EXPECT_EQ(receive.recv_offsets[q + 1] - receive.recv_offsets[q], receive.recv_counts[q]);
      }
    }
    EXPECT_EQ(sent_total, received_total) << "R=" << world << ": every sent row is received once";
  }
  EXPECT_ERROR_MENTIONS(ep::plan_receive({3, -1}), "counts[1] = -1");
  EXPECT_ERROR_MENTIONS(ep::plan_receive({INT_MAX, 1}), "sum past");
}

// ---- Configuration, workspace and run arguments ------------------------------------------------

EpOptions options_for(int max_tokens) {
  EpOptions options;
  options.max_tokens_per_rank = max_tokens;
  return options;
}

TEST(EpConfig, ArgumentsAreValidatedAndNamed) {
  const MoeSpec spec = preset("deepseek-v3-tp8");
  EXPECT_ERROR_MENTIONS(ep::make_ep_config(spec, 0, 3, options_for(64)), "world_size = 3");
  EXPECT_ERROR_MENTIONS(ep::make_ep_config(spec, 4, 4, options_for(64)), "rank = 4");
  EXPECT_ERROR_MENTIONS(ep::make_ep_config(spec, 0, 4, options_for(0)), "EpOptions.max_tokens_per_rank = 0");
  EXPECT_ERROR_MENTIONS(ep::make_ep_config(spec, 0, 4, options_for(ep::kMaxRows + 1)), "max_tokens_per_rank");
  EpOptions options = options_for(64);
  options.max_recv_rows = -1;
  EXPECT_ERROR_MENTIONS(ep::make_ep_config(spec, 0, 4, options), "EpOptions.max_recv_rows = -1");
  options = options_for(65536);  // 8 ranks × 65536 × 8 = 4M rows by default: too many for one runner
  EXPECT_ERROR_MENTIONS(ep::make_ep_config(spec, 0, 8, options), "max_recv_rows = 0: its default");
  options.max_recv_rows = 100000;
  EXPECT_EQ(ep::make_ep_config(spec, 0, 8, options).max_recv_rows, 100000);
  options = options_for(64);
  options.dispatch_dtype = static_cast<EpDispatchDType>(7);
  EXPECT_ERROR_MENTIONS(ep::make_ep_config(spec, 0, 4, options), "EpOptions.dispatch_dtype = 7");
  MoeSpec odd_hidden = spec;
  odd_hidden.hidden = 192;
  options.dispatch_dtype = EpDispatchDType::kFP8Block128;
  EXPECT_ERROR_MENTIONS(ep::make_ep_config(odd_hidden, 0, 4, options), "MoeSpec.hidden = 192");
  MoeSpec bad_spec = spec;
  bad_spec.top_k = 0;
  EXPECT_ERROR_MENTIONS(ep::make_ep_config(bad_spec, 0, 4, options_for(64)), "MoeSpec.top_k = 0");

  const ep::EpConfig config = ep::make_ep_config(spec, 2, 4, options_for(64));
  EXPECT_EQ(config.max_pairs, 64 * 8);
  EXPECT_EQ(config.max_recv_rows, 4 * 64 * 8);
  EXPECT_EQ(config.shard.first_expert, 128);
  EXPECT_EQ(config.shard.num_experts, 64);
  EXPECT_EQ(ep::local_plan_options(config).max_tokens, config.max_recv_rows);
}

TEST(EpConfig, LayerConstructionRejectsBadArgumentsBeforeTouchingTheCommunicator) {
  const MoeSpec spec = preset("deepseek-v3-tp8");
  EXPECT_ERROR_MENTIONS(EpMoeLayer(spec, 0, 3, nullptr, options_for(64)), "world_size = 3");
  EXPECT_ERROR_MENTIONS(EpMoeLayer(spec, 9, 8, nullptr, options_for(64)), "rank = 9");
  EXPECT_ERROR_MENTIONS(EpMoeLayer(spec, 0, 8, nullptr, options_for(0)), "max_tokens_per_rank = 0");
  EXPECT_ERROR_MENTIONS(EpMoeLayer(spec, 0, 8, nullptr, options_for(64)), "comm is null");
}

TEST(EpConfig, WorkspaceRegionsAreAlignedDisjointAndLargeEnough) {
  for (bool fp8 : {false, true}) {
    for (int world : {1, 2, 8}) {
      EpOptions options = options_for(100);
      if (fp8) options.dispatch_dtype = EpDispatchDType::kFP8Block128;
      const ep::EpConfig config = ep::make_ep_config(preset("deepseek-v3-tp8"), 0, world, options);
      const std::size_t runner_bytes = 12345;
      const ep::EpWorkspaceLayout layout = ep::ep_workspace_layout(config, runner_bytes);
      const std::size_t pairs = config.max_pairs, recv = config.max_recv_rows, hidden = config.spec.hidden;
      const std::size_t groups = hidden / 128;
      struct Region {
        const char* name;
        std::size_t offset, bytes;
      };
      std::vector<Region> regions = {
          {"topk_ids", layout.topk_ids, pairs * 4},
          {"topk_weights", layout.topk_weights, pairs * 4},
          {"chunk_bases", layout.chunk_bases, static_cast<std::size_t>(ep::plan_chunks(config.max_pairs)) * world * 4},
          {"exchange_counts", layout.exchange_counts, 2u * world * 4},
          {"valid_rows", layout.valid_rows, 4},
          {"pair_rows", layout.pair_rows, pairs * 4},
          {"send_tokens", layout.send_tokens, pairs * 4},
          {"send_ids", layout.send_ids, pairs * 4},
          {"send_weights", layout.send_weights, pairs * 4},
          {"send_rows", layout.send_rows, pairs * hidden * 2},
          {"recv_ids", layout.recv_ids, recv * 4},
          {"recv_weights", layout.recv_weights, recv * 4},
          {"recv_rows", layout.recv_rows, recv * hidden * 2},
          {"runner", layout.runner, runner_bytes}};
      if (fp8) {
        regions.push_back({"send_scales", layout.send_scales, pairs * groups * 4});
        regions.push_back({"recv_fp8_rows", layout.recv_fp8_rows, recv * hidden});
        regions.push_back({"recv_scales", layout.recv_scales, recv * groups * 4});
      }
      for (const Region& a : regions) {
        EXPECT_EQ(a.offset % 256, 0u) << a.name;
        EXPECT_LE(a.offset + a.bytes, layout.total) << a.name;
        for (const Region& b : regions) {
          if (&a == &b) continue;
          EXPECT_TRUE(a.offset + a.bytes <= b.offset || b.offset + b.bytes <= a.offset) << a.name << " / " << b.name;
        }
      }
    }
  }
}

void* fake_device_pointer(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

struct EpRunArgsTest : ::testing::Test {
  ep::EpConfig config = ep::make_ep_config(preset("qwen3-30b-a3b"), 1, 4, options_for(64));
  std::size_t workspace_bytes = 1 << 20;
  EpRunArgs args;
  void* ids = fake_device_pointer(0x20000000);
  void* weights = fake_device_pointer(0x30000000);

  void SetUp() override {
    args = EpRunArgs{};
    args.num_tokens = 16;
    args.x = fake_device_pointer(0x1000000);
    args.out = fake_device_pointer(0x2000000);
    args.weights.w13 = fake_device_pointer(0x3000000);
    args.weights.w2 = fake_device_pointer(0x4000000);
    args.workspace = fake_device_pointer(0x10000000);
    args.workspace_size = workspace_bytes;
  }
  void check() { ep::check_topk_args(config, args, workspace_bytes, ids, weights); }
};

TEST_F(EpRunArgsTest, GoodArgumentsPass) {
  EXPECT_NO_THROW(check());
  args.out = const_cast<void*>(args.x);  // in place
  EXPECT_NO_THROW(check());
  args.num_tokens = 0;  // no tokens here: x and out are never touched, the exchanges still run
  args.x = nullptr;
  args.out = nullptr;
  EXPECT_NO_THROW(ep::check_topk_args(config, args, workspace_bytes, nullptr, nullptr));
  EXPECT_NO_THROW(ep::check_logits_args(config, args, workspace_bytes, nullptr));
}

TEST_F(EpRunArgsTest, BadArgumentsAreNamed) {
  args.num_tokens = 65;
  EXPECT_ERROR_MENTIONS(check(), "EpRunArgs.num_tokens = 65: expected 0..EpOptions.max_tokens_per_rank=64");
  SetUp();
  args.x = nullptr;
  EXPECT_ERROR_MENTIONS(check(), "EpRunArgs.x is null");
  SetUp();
  args.out = fake_device_pointer(0x2000004);
  EXPECT_ERROR_MENTIONS(check(), "EpRunArgs.out");
  SetUp();
  args.num_tokens = 0;
  args.weights.w13 = nullptr;  // the local experts run even when this rank has no tokens
  EXPECT_ERROR_MENTIONS(check(), "EpRunArgs.weights.w13 is null");
  SetUp();
  args.workspace = fake_device_pointer(0x10000010);
  EXPECT_ERROR_MENTIONS(check(), "EpRunArgs.workspace");
  SetUp();
  args.workspace_size = workspace_bytes - 1;
  EXPECT_ERROR_MENTIONS(check(), "EpRunArgs.workspace_size");
  SetUp();
  args.weights.w13_scale = static_cast<const float*>(fake_device_pointer(0x5000000));
  EXPECT_ERROR_MENTIONS(check(), "w13_scale/w2_scale are set for a bf16 layer");
  SetUp();
  args.act_scale = static_cast<const float*>(fake_device_pointer(0x5000000));
  EXPECT_ERROR_MENTIONS(check(), "act_scale");
  SetUp();
  EXPECT_ERROR_MENTIONS(ep::check_topk_args(config, args, workspace_bytes, nullptr, weights), "topk_ids is null");
  EXPECT_ERROR_MENTIONS(ep::check_logits_args(config, args, workspace_bytes, nullptr), "router_logits is null");
  args.out = fake_device_pointer(0x10000100);  // inside the workspace
  EXPECT_ERROR_MENTIONS(check(), "overlaps");
  SetUp();
  args.out = fake_device_pointer(0x1000100);  // overlaps x without being x
  EXPECT_ERROR_MENTIONS(check(), "EpRunArgs.out");

  ep::EpConfig fp8 = ep::make_ep_config(
      [] {
        MoeSpec spec = preset("qwen3-30b-a3b");
        spec.weight_dtype = WeightDType::kFP8E4M3;
        spec.scheme = QuantScheme::kBlock128;
        return spec;
      }(),
      0, 2, options_for(64));
  SetUp();
  EXPECT_ERROR_MENTIONS(ep::check_topk_args(fp8, args, workspace_bytes, ids, weights), "w13_scale is null");
}

// ---- The whole layer, simulated ------------------------------------------------------------

// One layer on the host: bf16 weights, and for FP8 specs their quantised form.
struct HostLayer {
  MoeSpec spec;
  std::vector<std::uint16_t> w13, w2;
  reference::QuantizedWeights w13_fp8, w2_fp8;
  reference::Fp8Options fp8_options;
  bool fp8() const { return spec.weight_dtype == WeightDType::kFP8E4M3; }
};

std::vector<std::uint16_t> random_bf16(std::size_t count, float scale, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::uint16_t> bits(count);
  for (std::uint16_t& b : bits) {
    float v = value(rng) * scale;
    if (v == 0.0f) v = scale * 0.5f;
    b = reference::float_to_bf16(v);
  }
  return bits;
}

HostLayer make_host_layer(const MoeSpec& spec, std::uint64_t seed, const reference::Fp8Options& fp8_options = {}) {
  HostLayer layer;
  layer.spec = spec;
  const std::size_t experts = spec.num_experts, hidden = spec.hidden, intermediate = spec.intermediate;
  layer.w13 = random_bf16(experts * 2 * intermediate * hidden, 1.0f / std::sqrt(float(hidden)), seed);
  layer.w2 = random_bf16(experts * hidden * intermediate, 1.0f / std::sqrt(float(intermediate)), seed + 1);
  layer.fp8_options = fp8_options;
  layer.fp8_options.ue8m0_scales = spec.ue8m0_scales;
  if (layer.fp8()) {
    layer.w13_fp8 = reference::quantize_weights(spec.scheme, layer.w13.data(), spec.num_experts, 2 * spec.intermediate,
                                                spec.hidden, layer.fp8_options);
    layer.w2_fp8 = reference::quantize_weights(spec.scheme, layer.w2.data(), spec.num_experts, spec.hidden,
                                               spec.intermediate, layer.fp8_options);
  }
  return layer;
}

reference::QuantizedWeights slice_experts(const reference::QuantizedWeights& weights, const ExpertShard& shard) {
  reference::QuantizedWeights slice = weights;
  slice.experts = shard.num_experts;
  const std::size_t values = std::size_t(weights.rows) * weights.cols;
  const std::size_t scales = weights.scales.size() / weights.experts;
  slice.values.assign(weights.values.begin() + shard.first_expert * values,
                      weights.values.begin() + (shard.first_expert + shard.num_experts) * values);
  slice.scales.assign(weights.scales.begin() + shard.first_expert * scales,
                      weights.scales.begin() + (shard.first_expert + shard.num_experts) * scales);
  return slice;
}

std::vector<int> all_rows(int count) {
  std::vector<int> rows(count);
  std::iota(rows.begin(), rows.end(), 0);
  return rows;
}

// The layer of `spec` over `experts` (a shard, or all of them), as the reference computes it.
std::vector<double> reference_layer(const HostLayer& layer, const MoeSpec& spec, const ExpertShard& experts,
                                    const std::vector<std::uint16_t>& x, const reference::Routing& routing) {
  if (routing.num_tokens == 0) return {};
  const std::size_t hidden = spec.hidden, intermediate = spec.intermediate;
  const std::vector<int> tokens = all_rows(routing.num_tokens);
  if (!layer.fp8()) {
    const reference::Bf16Layer view{x.data(), layer.w13.data() + experts.first_expert * 2 * intermediate * hidden,
                                    layer.w2.data() + experts.first_expert * hidden * intermediate};
    return reference::moe_layer(spec, view, routing, tokens, 1);
  }
  const reference::QuantizedWeights w13 = slice_experts(layer.w13_fp8, experts);
  const reference::QuantizedWeights w2 = slice_experts(layer.w2_fp8, experts);
  return reference::moe_layer(spec, reference::Fp8Layer{x.data(), &w13, &w2, layer.fp8_options}, routing, tokens, 1);
}

struct RankInputs {
  std::vector<std::uint16_t> x;  // [T, H]
  reference::Routing routing;    // [T, k]
};

struct Simulation {
  std::vector<std::vector<double>> out;  // per rank [T, H]
  std::vector<DispatchPlan> plans;
  std::vector<ep::ReceivePlan> receives;
};

// The expert-parallel layer of R ranks in one process, step for step as EpMoeLayer runs it: plan,
// pack, count exchange, row exchange, local experts (top_k = 1 per received row), return, combine
// in slot order. The all-to-alls are vector copies.
Simulation simulate_ep(const HostLayer& layer, int world, const std::vector<RankInputs>& inputs, bool fp8_dispatch) {
  const MoeSpec& spec = layer.spec;
  const MoeSpec local_spec = ep_local_spec(spec, world);
  const int hidden = spec.hidden, top_k = spec.top_k, groups = hidden / ep::kDispatchGroup;
  Simulation sim;

  // Plan and pack: send rows carry x (bf16), or its e4m3 values and group scales.
  std::vector<std::vector<std::uint16_t>> send_x(world);
  std::vector<std::vector<std::uint8_t>> send_fp8(world);
  std::vector<std::vector<float>> send_scales(world);
  for (int r = 0; r < world; ++r) {
    const reference::Routing& routing = inputs[r].routing;
    sim.plans.push_back(ep::plan_dispatch(routing.ids.data(), routing.weights.data(), routing.num_tokens, top_k,
                                          spec.num_experts, world));
    const DispatchPlan& plan = sim.plans.back();
    const int rows = plan.send_rows();
    send_x[r].resize(std::size_t(rows) * hidden);
    for (int row = 0; row < rows; ++row)
      std::copy_n(inputs[r].x.begin() + std::size_t(plan.send_token(row)) * hidden, hidden,
                  send_x[r].begin() + std::size_t(row) * hidden);
    if (fp8_dispatch) {
      send_fp8[r].resize(std::size_t(rows) * hidden);
      send_scales[r].resize(std::size_t(rows) * groups);
      for (int row = 0; row < rows; ++row)
        ep::fp8_dispatch_quantize(send_x[r].data() + std::size_t(row) * hidden, hidden, spec.ue8m0_scales,
                                  send_fp8[r].data() + std::size_t(row) * hidden,
                                  send_scales[r].data() + std::size_t(row) * groups);
    }
  }

  // Count exchange, then rows, ids and weights from every peer, in peer order.
  const std::vector<std::vector<int>> received_counts = ep::exchange_counts(sim.plans);
  std::vector<std::vector<double>> local_out(world);
  for (int r = 0; r < world; ++r) {
    sim.receives.push_back(ep::plan_receive(received_counts[r]));
    const ep::ReceivePlan& receive = sim.receives.back();
    const int rows = receive.total_rows();
    std::vector<std::uint16_t> recv_x(std::size_t(rows) * hidden);
    reference::Routing local_routing;
    local_routing.num_tokens = rows;
    local_routing.top_k = 1;
    local_routing.ids.resize(rows);
    local_routing.weights.resize(rows);
    for (int q = 0; q < world; ++q) {
      const DispatchPlan& source = sim.plans[q];
      for (int i = 0; i < receive.recv_counts[q]; ++i) {
        const int from = source.send_offsets[r] + i, to = receive.recv_offsets[q] + i;
        if (fp8_dispatch)
          ep::fp8_dispatch_dequantize(send_fp8[q].data() + std::size_t(from) * hidden,
                                      send_scales[q].data() + std::size_t(from) * groups, hidden,
                                      recv_x.data() + std::size_t(to) * hidden);
        else
          std::copy_n(send_x[q].begin() + std::size_t(from) * hidden, hidden,
                      recv_x.begin() + std::size_t(to) * hidden);
        local_routing.ids[to] = source.send_local_ids[from];
        local_routing.weights[to] = source.send_weights[from];
      }
    }
    for (std::int32_t id : local_routing.ids) EXPECT_TRUE(id >= 0 && id < local_spec.num_experts) << id;
    local_out[r] = reference_layer(layer, local_spec, expert_shard(spec.num_experts, r, world), recv_x, local_routing);
  }

  // Results return to the send row they came from; the combine sums each token's slots in order.
  for (int q = 0; q < world; ++q) {
    const DispatchPlan& plan = sim.plans[q];
    std::vector<double> returned(std::size_t(plan.send_rows()) * hidden);
    for (int r = 0; r < world; ++r) {
      const ep::ReceivePlan& receive = sim.receives[r];
      std::copy_n(local_out[r].begin() + std::size_t(receive.recv_offsets[q]) * hidden,
                  std::size_t(receive.recv_counts[q]) * hidden,
                  returned.begin() + std::size_t(plan.send_offsets[r]) * hidden);
    }
    std::vector<double> out(std::size_t(plan.num_tokens) * hidden, 0.0);
    for (int t = 0; t < plan.num_tokens; ++t) {
      for (int j = 0; j < top_k; ++j) {
        const int row = plan.pair_rows[t * top_k + j];
        if (row < 0) continue;
        for (int h = 0; h < hidden; ++h) out[std::size_t(t) * hidden + h] += returned[std::size_t(row) * hidden + h];
      }
    }
    sim.out.push_back(std::move(out));
  }
  return sim;
}

// The single-layer result every rank's tokens must get; with FP8 dispatch applied to x first
// when asked (the rows the experts see).
std::vector<double> single_layer(const HostLayer& layer, const RankInputs& inputs, bool fp8_dispatch_x) {
  std::vector<std::uint16_t> x = inputs.x;
  if (fp8_dispatch_x) {
    const int hidden = layer.spec.hidden;
    std::vector<std::uint8_t> values(hidden);
    std::vector<float> scales(hidden / ep::kDispatchGroup);
    for (int t = 0; t < inputs.routing.num_tokens; ++t) {
      std::uint16_t* row = x.data() + std::size_t(t) * hidden;
      ep::fp8_dispatch_quantize(row, hidden, layer.spec.ue8m0_scales, values.data(), scales.data());
      ep::fp8_dispatch_dequantize(values.data(), scales.data(), hidden, row);
    }
  }
  return reference_layer(layer, layer.spec, ExpertShard{0, layer.spec.num_experts}, x, inputs.routing);
}

enum class RoutingCase { kUniform, kOneRank, kExtreme, kInvalid, kLogits };

RankInputs make_inputs(const HostLayer& layer, int tokens, RoutingCase routing, int world, std::uint64_t seed) {
  const MoeSpec& spec = layer.spec;
  RankInputs inputs;
  inputs.x = random_bf16(std::size_t(tokens) * spec.hidden, 1.0f, seed);
  if (routing == RoutingCase::kLogits) {
    std::mt19937_64 rng(seed + 5);
    std::normal_distribution<float> logit(0.0f, 2.0f);
    std::vector<float> logits(std::size_t(tokens) * spec.num_experts);
    for (float& value : logits) value = logit(rng);
    inputs.routing = reference::route(spec, logits.data(), tokens);
    return inputs;
  }
  Draw draw;
  switch (routing) {
    case RoutingCase::kOneRank:
      draw = one_rank_draw(tokens, spec.top_k, spec.num_experts, world, world - 1, seed);
      break;
    case RoutingCase::kExtreme: draw = extreme_draw(tokens, spec.top_k, seed); break;
    default: draw = uniform_draw(tokens, spec.top_k, spec.num_experts, seed); break;
  }
  if (routing == RoutingCase::kInvalid) make_some_invalid(draw, spec.num_experts, 3);
  inputs.routing.num_tokens = tokens;
  inputs.routing.top_k = spec.top_k;
  inputs.routing.ids = draw.ids;
  inputs.routing.weights = draw.weights;
  return inputs;
}

struct Comparison {
  std::size_t mismatches = 0;
  double max_abs_diff = 0.0;
  double rel_error = 0.0;
};

Comparison compare(const std::vector<double>& expected, const std::vector<double>& actual) {
  Comparison result;
  EXPECT_EQ(expected.size(), actual.size());
  for (std::size_t i = 0; i < std::min(expected.size(), actual.size()); ++i) {
    if (expected[i] != actual[i]) ++result.mismatches;
    result.max_abs_diff = std::max(result.max_abs_diff, std::fabs(expected[i] - actual[i]));
  }
  if (!expected.empty()) result.rel_error = reference::relative_error(expected.data(), actual.data(), expected.size());
  return result;
}

// Runs the simulation for one configuration and checks every rank's output equals the single
// layer bit for bit (float64: the same products, summed in the same slot order).
void expect_ep_equals_single_layer(const HostLayer& layer, int world, const std::vector<int>& tokens_per_rank,
                                   RoutingCase routing, bool fp8_dispatch = false) {
  std::vector<RankInputs> inputs;
  for (int r = 0; r < world; ++r)
    inputs.push_back(make_inputs(layer, tokens_per_rank[r % tokens_per_rank.size()], routing, world, 100 * r + 17));
  const Simulation sim = simulate_ep(layer, world, inputs, fp8_dispatch);
  std::string sent;
  for (int r = 0; r < world; ++r) {
    const Comparison result = compare(single_layer(layer, inputs[r], fp8_dispatch), sim.out[r]);
    EXPECT_EQ(result.mismatches, 0u) << "rank " << r << " of " << world << ": max |diff| " << result.max_abs_diff;
    sent += (r ? " " : "") + std::to_string(sim.plans[r].send_rows()) + "/" +
            std::to_string(sim.receives[r].total_rows());
  }
  std::cout << "  R=" << world << " E=" << layer.spec.num_experts << " k=" << layer.spec.top_k
            << (fp8_dispatch ? " fp8-dispatch" : "") << ": rows sent/received per rank " << sent
            << ", outputs bit-identical to the single layer\n";
}

// DeepSeek-V3's routing (E = 256, k = 8, grouped sigmoid) on small H and I: the reference cost
// scales with k·H·I per token.
MoeSpec small_deepseek() {
  MoeSpec spec = preset("deepseek-v3-tp8");
  spec.hidden = 128;
  spec.intermediate = 64;
  return spec;
}

class EpSimulation : public ::testing::Test {
 protected:
  static const HostLayer& deepseek() {
    static const HostLayer layer = make_host_layer(small_deepseek(), 1);
    return layer;
  }
};

TEST_F(EpSimulation, DeepSeekV3UniformRoutingEveryWorldSize) {
  for (int world : {1, 2, 4, 8})
    expect_ep_equals_single_layer(deepseek(), world, {1, 64, 7, 0, 33}, RoutingCase::kUniform);
}

TEST_F(EpSimulation, DeepSeekV3GroupedRoutingFromLogits) {
  for (int world : {2, 8}) expect_ep_equals_single_layer(deepseek(), world, {40, 3}, RoutingCase::kLogits);
}

TEST_F(EpSimulation, SkewedRoutingAllToOneRank) {
  for (int world : {2, 4, 8}) expect_ep_equals_single_layer(deepseek(), world, {48, 5}, RoutingCase::kOneRank);
}

TEST_F(EpSimulation, ExtremeRoutingAndInvalidIds) {
  for (int world : {1, 4, 8}) {
    expect_ep_equals_single_layer(deepseek(), world, {32, 1}, RoutingCase::kExtreme);
    expect_ep_equals_single_layer(deepseek(), world, {32, 9}, RoutingCase::kInvalid);
  }
}

TEST_F(EpSimulation, EveryRankWithoutTokens) {
  expect_ep_equals_single_layer(deepseek(), 4, {0}, RoutingCase::kUniform);
}

TEST(EpSimulationShapes, OneExpertPerRankAndMixtralShape) {
  MoeSpec mixtral = preset("mixtral-8x7b");  // E = 8, k = 2
  mixtral.hidden = 128;
  mixtral.intermediate = 128;
  const HostLayer layer = make_host_layer(mixtral, 3);
  for (int world : {1, 2, 4, 8}) expect_ep_equals_single_layer(layer, world, {20, 3, 0}, RoutingCase::kUniform);
}

MoeSpec small_fp8(QuantScheme scheme, bool ue8m0) {
  MoeSpec spec = small_deepseek();
  spec.hidden = 256;
  spec.intermediate = 128;
  spec.weight_dtype = WeightDType::kFP8E4M3;
  spec.scheme = scheme;
  spec.ue8m0_scales = ue8m0;
  return spec;
}

TEST(EpSimulationFp8, Fp8LayersMatchTheSingleFp8Layer) {
  // Activation scales are per row (fp8-block, fp8-channel) or static (fp8-tensor): the same on
  // whichever rank a row lands. Dynamic per-tensor scales are not (docs/EP.md).
  reference::Fp8Options static_scales;
  static_scales.static_act_scale = true;
  static_scales.act_scale = 1.0f / 448.0f;
  static_scales.intermediate_act_scale = 0.05f / 448.0f;
  const std::pair<MoeSpec, reference::Fp8Options> cases[] = {
      {small_fp8(QuantScheme::kBlock128, false), {}},
      {small_fp8(QuantScheme::kBlock128, true), {}},
      {small_fp8(QuantScheme::kPerChannelPerToken, false), {}},
      {small_fp8(QuantScheme::kPerTensor, false), static_scales}};
  for (const auto& [spec, options] : cases) {
    const HostLayer layer = make_host_layer(spec, 5, options);
    expect_ep_equals_single_layer(layer, 4, {16, 3}, RoutingCase::kUniform);
  }
}

TEST(EpSimulationFp8, Fp8DispatchEqualsTheLayerOnDispatchRoundedRows) {
  // The experts see each token's x after one e4m3 round trip, whichever rank they are on.
  const HostLayer bf16 = make_host_layer([] {
    MoeSpec spec = small_deepseek();
    spec.hidden = 256;
    return spec;
  }(), 7);
  for (int world : {1, 2, 8}) expect_ep_equals_single_layer(bf16, world, {24, 5}, RoutingCase::kUniform, true);
  const HostLayer block = make_host_layer(small_fp8(QuantScheme::kBlock128, false), 9);
  expect_ep_equals_single_layer(block, 4, {24, 5}, RoutingCase::kInvalid, true);
}

TEST(EpSimulationFp8, Fp8DispatchAccuracy) {
  // bf16 layer: what the extra rounding costs against the bf16 dispatch (reported; bounded loosely).
  // fp8-block layers: the round trip is lossless. The group's amax is a bf16 value, so
  // bf16(448 × scale) gives it back and the layer's own quantisation finds the same scale; every
  // other bf16(value × scale) lies within 2^-8 of value × scale, so it re-quantises to the same e4m3
  // value. The result equals the bf16-dispatch one bit for bit, with or without UE8M0 scales.
  struct Case {
    const char* name;
    MoeSpec spec;
    double bound;
    bool exact;
  };
  MoeSpec bf16_spec = small_deepseek();
  bf16_spec.hidden = 256;
  const Case cases[] = {{"bf16 layer", bf16_spec, 6e-2, false},
                        {"fp8-block layer", small_fp8(QuantScheme::kBlock128, false), 0.0, true},
                        {"fp8-block UE8M0 layer", small_fp8(QuantScheme::kBlock128, true), 0.0, true}};
  for (const Case& c : cases) {
    const HostLayer layer = make_host_layer(c.spec, 13);
    std::vector<RankInputs> inputs;
    for (int r = 0; r < 4; ++r) inputs.push_back(make_inputs(layer, 32, RoutingCase::kUniform, 4, 300 + r));
    const Simulation plain = simulate_ep(layer, 4, inputs, false);
    const Simulation fp8 = simulate_ep(layer, 4, inputs, true);
    std::vector<double> all_plain, all_fp8;
    for (int r = 0; r < 4; ++r) {
      all_plain.insert(all_plain.end(), plain.out[r].begin(), plain.out[r].end());
      all_fp8.insert(all_fp8.end(), fp8.out[r].begin(), fp8.out[r].end());
    }
    const Comparison result = compare(all_plain, all_fp8);
    std::cout << "  " << c.name << ": fp8 dispatch vs bf16 dispatch rel_err " << result.rel_error << ", "
              << result.mismatches << " of " << all_plain.size() << " values differ\n";
    if (c.exact)
      EXPECT_EQ(result.mismatches, 0u) << c.name;
    else
      EXPECT_LE(result.rel_error, c.bound) << c.name;
  }
}

}  // namespace
}  // namespace hmoe::test
