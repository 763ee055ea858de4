// The expert-parallel layer on GPUs: the device dispatch plan and row packing bit-exact with the
// host logic (any R, no NCCL needed), R = 1 through NCCL on one GPU against the single-GPU layer,
// and — when the host has 2, 4 or 8 GPUs — one thread per GPU against the single-GPU layer.
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <exception>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ep/config.hpp"
#include "ep/dispatch_kernels.hpp"
#include "ep/dispatch_plan.hpp"
#include "ep/ep_layer_data.hpp"
#include "ep/fp8_dispatch_reference.hpp"
#include "gpu_test_support.hpp"
#include "hmoe/ep.hpp"
#include "reference/reference.hpp"
#include "testkit/check.hpp"

namespace hmoe::test {
namespace {

using testkit::DeviceBuffer;
using testkit::RoutingMode;

#define HMOE_TEST_NCCL(call)                                                              \
  do {                                                                                    \
    const ncclResult_t status_ = (call);                                                  \
    ASSERT_EQ(status_, ncclSuccess) << #call << ": " << ncclGetErrorString(status_);     \
  } while (0)

template <class T>
std::vector<T> to_host(const DeviceBuffer& buffer, std::size_t count, cudaStream_t stream) {
  return testkit::copy_to_host<T>(buffer.get(), count, stream);
}

// ---- The device plan and the packing, against the host logic ----------------------------------

struct DevicePlan {
  std::vector<int> send_counts, pair_rows, send_tokens, send_ids;
  std::vector<float> send_weights;
  int valid_rows = 0;
  int invalid = 0;
};

DevicePlan run_device_plan(const std::vector<std::int32_t>& ids, const std::vector<float>& weights, int tokens,
                           int top_k, int experts, int world, cudaStream_t stream) {
  const std::size_t pairs = ids.size();
  DeviceBuffer ids_device(std::max<std::size_t>(pairs, 1) * 4), weights_device(std::max<std::size_t>(pairs, 1) * 4);
  testkit::copy_to_device(ids_device.get(), ids, stream);
  testkit::copy_to_device(weights_device.get(), weights, stream);
  DeviceBuffer chunk_bases(std::max(ep::plan_chunks(static_cast<int>(pairs)), 1) * world * 4);
  DeviceBuffer counts(world * 4), valid(4), invalid(4);
  DeviceBuffer pair_rows(std::max<std::size_t>(pairs, 1) * 4), tokens_buffer(std::max<std::size_t>(pairs, 1) * 4);
  DeviceBuffer send_ids(std::max<std::size_t>(pairs, 1) * 4), send_weights(std::max<std::size_t>(pairs, 1) * 4);
  HMOE_CUDA_CHECK(cudaMemsetAsync(invalid.get(), 0, 4, stream));
  ep::DispatchBuffers buffers{chunk_bases.as<int>(), counts.as<int>(), valid.as<int>(), pair_rows.as<int>(),
                              tokens_buffer.as<int>(), send_ids.as<std::int32_t>(), send_weights.as<float>()};
  ep::launch_dispatch_plan(ids_device.as<const std::int32_t>(), weights_device.as<const float>(), tokens, top_k,
                           experts, world, buffers, invalid.as<int>(), stream);
  DevicePlan plan;
  plan.valid_rows = to_host<int>(valid, 1, stream)[0];
  plan.invalid = to_host<int>(invalid, 1, stream)[0];
  plan.send_counts = to_host<int>(counts, world, stream);
  plan.pair_rows = to_host<int>(pair_rows, pairs, stream);
  plan.send_tokens = to_host<int>(tokens_buffer, plan.valid_rows, stream);
  plan.send_ids = to_host<int>(send_ids, plan.valid_rows, stream);
  plan.send_weights = to_host<float>(send_weights, plan.valid_rows, stream);
  return plan;
}

// Ids from the testkit's generator (distinct per token), then every `invalid_period`-th made bad.
void host_topk(const MoeSpec& spec, int tokens, RoutingMode mode, std::uint64_t seed, int invalid_period,
               std::vector<std::int32_t>& ids, std::vector<float>& weights, cudaStream_t stream) {
  const std::size_t pairs = static_cast<std::size_t>(tokens) * spec.top_k;
  DeviceBuffer ids_device(std::max<std::size_t>(pairs, 1) * 4), weights_device(std::max<std::size_t>(pairs, 1) * 4);
  if (tokens > 0)
    testkit::generate_topk(spec, tokens, {mode, 1, seed}, ids_device.as<std::int32_t>(), weights_device.as<float>(),
                           stream);
  ids = to_host<std::int32_t>(ids_device, pairs, stream);
  weights = to_host<float>(weights_device, pairs, stream);
  const std::int32_t bad[] = {-1, spec.num_experts, INT_MIN, INT_MAX};
  if (invalid_period > 0)
    for (std::size_t p = 0; p < pairs; p += invalid_period) ids[p] = bad[(p / invalid_period) % 4];
}

TEST(EpDevicePlan, MatchesTheHostPlanBitForBit) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream;
  MoeSpec spec = preset("deepseek-v3-tp8");
  int cases = 0;
  for (int world : {1, 2, 4, 8, 64, 256}) {
    for (int tokens : {0, 1, 7, 64, 1000, 4096}) {
      for (RoutingMode mode : {RoutingMode::kUniform, RoutingMode::kZipf, RoutingMode::kExtreme}) {
        std::vector<std::int32_t> ids;
        std::vector<float> weights;
        host_topk(spec, tokens, mode, 40 + tokens, tokens % 2 == 1 ? 5 : 0, ids, weights, stream.get());
        const ep::DispatchPlan expected =
            ep::plan_dispatch(ids.data(), weights.data(), tokens, spec.top_k, spec.num_experts, world);
        const DevicePlan actual =
            run_device_plan(ids, weights, tokens, spec.top_k, spec.num_experts, world, stream.get());
        const std::string what = "R=" + std::to_string(world) + " T=" + std::to_string(tokens) + " " +
                                 testkit::to_string(mode);
        ASSERT_EQ(actual.send_counts, expected.send_counts) << what;
        ASSERT_EQ(actual.valid_rows, expected.send_rows()) << what;
        ASSERT_EQ(actual.invalid, expected.invalid_pairs) << what;
        ASSERT_EQ(actual.pair_rows, expected.pair_rows) << what;
        for (int row = 0; row < expected.send_rows(); ++row) {
          ASSERT_EQ(actual.send_tokens[row], expected.send_token(row)) << what << " row " << row;
          ASSERT_EQ(actual.send_ids[row], expected.send_local_ids[row]) << what << " row " << row;
          ASSERT_EQ(actual.send_weights[row], expected.send_weights[row]) << what << " row " << row;
        }
        ++cases;
      }
    }
  }
  std::cout << "  " << cases << " device plans equal plan_dispatch\n";
}

TEST(EpDevicePlan, PackedRowsMatchTheHost) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream;
  const int tokens = 300, hidden = 7168, groups = hidden / ep::kDispatchGroup, rows = 500;
  DeviceBuffer x(std::size_t(tokens) * hidden * 2);
  testkit::fill_uniform_bf16(x.as<std::uint16_t>(), std::size_t(tokens) * hidden, 3.0f, 9, 1, stream.get());
  std::vector<std::uint16_t> x_host = to_host<std::uint16_t>(x, std::size_t(tokens) * hidden, stream.get());
  for (int c = 0; c < hidden; ++c) x_host[c] = 0;  // an all-zero row: scale 1
  testkit::copy_to_device(x.get(), x_host, stream.get());
  std::vector<int> send_tokens(rows);
  for (int r = 0; r < rows; ++r) send_tokens[r] = (r * 7) % tokens;
  const int valid = rows - 3;  // rows past *valid_rows stay untouched
  DeviceBuffer tokens_device(rows * 4), valid_device(4);
  testkit::copy_to_device(tokens_device.get(), send_tokens, stream.get());
  testkit::copy_to_device(valid_device.get(), std::vector<int>{valid}, stream.get());

  DeviceBuffer packed(std::size_t(rows) * hidden * 2);
  ep::launch_pack_rows(x.get(), tokens_device.as<int>(), valid_device.as<int>(), rows, hidden, packed.get(),
                       stream.get());
  const std::vector<std::uint16_t> packed_host =
      to_host<std::uint16_t>(packed, std::size_t(valid) * hidden, stream.get());
  for (int r = 0; r < valid; ++r) {
    const auto row = packed_host.begin() + std::size_t(r) * hidden;
    ASSERT_TRUE(std::equal(row, row + hidden, x_host.begin() + std::size_t(send_tokens[r]) * hidden)) << "row " << r;
  }

  for (bool ue8m0 : {false, true}) {
    DeviceBuffer values(std::size_t(rows) * hidden), scales(std::size_t(rows) * groups * 4);
    ep::launch_pack_rows_fp8(x.get(), tokens_device.as<int>(), valid_device.as<int>(), rows, hidden, ue8m0,
                             values.get(), scales.as<float>(), stream.get());
    DeviceBuffer unpacked(std::size_t(valid) * hidden * 2);
    ep::launch_unpack_fp8_rows(values.get(), scales.as<float>(), valid, hidden, unpacked.get(), stream.get());
    const auto values_host = to_host<std::uint8_t>(values, std::size_t(valid) * hidden, stream.get());
    const auto scales_host = to_host<float>(scales, std::size_t(valid) * groups, stream.get());
    const auto unpacked_host = to_host<std::uint16_t>(unpacked, std::size_t(valid) * hidden, stream.get());
    std::vector<std::uint8_t> expected_values(hidden);
    std::vector<float> expected_scales(groups);
    std::vector<std::uint16_t> expected_row(hidden);
    for (int r = 0; r < valid; ++r) {
      ep::fp8_dispatch_quantize(x_host.data() + std::size_t(send_tokens[r]) * hidden, hidden, ue8m0,
                                expected_values.data(), expected_scales.data());
      ep::fp8_dispatch_dequantize(expected_values.data(), expected_scales.data(), hidden, expected_row.data());
      ASSERT_TRUE(
          std::equal(expected_values.begin(), expected_values.end(), values_host.begin() + std::size_t(r) * hidden))
          << "e4m3 values of row " << r << (ue8m0 ? " (ue8m0)" : "");
      ASSERT_TRUE(
          std::equal(expected_scales.begin(), expected_scales.end(), scales_host.begin() + std::size_t(r) * groups))
          << "scales of row " << r;
      ASSERT_TRUE(std::equal(expected_row.begin(), expected_row.end(), unpacked_host.begin() + std::size_t(r) * hidden))
          << "dequantised row " << r;
    }
  }
}

// ---- The layer through NCCL ----------------------------------------------------------------

struct OutputComparison {
  double rel_error = 0.0;
  std::size_t bit_identical = 0, elements = 0, unwritten = 0, nonfinite = 0;
  std::string summary() const {
    return "rel_err " + std::to_string(rel_error) + ", bit-identical " + std::to_string(bit_identical) + "/" +
           std::to_string(elements) + ", unwritten " + std::to_string(unwritten) + ", nonfinite " +
           std::to_string(nonfinite);
  }
};

OutputComparison compare_outputs(const std::vector<std::uint16_t>& expected, const std::vector<std::uint16_t>& actual) {
  OutputComparison result;
  result.elements = expected.size();
  std::vector<double> expected_values(expected.size()), actual_values(actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    result.bit_identical += expected[i] == actual[i];
    result.unwritten += actual[i] == testkit::kPoisonBf16;
    expected_values[i] = reference::bf16_to_float(expected[i]);
    actual_values[i] = reference::bf16_to_float(actual[i]);
    result.nonfinite += actual[i] != testkit::kPoisonBf16 && !std::isfinite(actual_values[i]);
  }
  if (result.elements > 0)
    result.rel_error = reference::relative_error(expected_values.data(), actual_values.data(), result.elements);
  return result;
}

enum class Entry { kTopK, kLogits };

struct RankResult {
  std::vector<std::uint16_t> ep_out, single_out;
  int ep_invalid = 0, single_invalid = 0;
  EpExchangeCounts exchange;
};

// One rank: the EP layer and the single-GPU layer (all experts on this GPU) on the same inputs.
// `runs` EP runs; their outputs must agree bit for bit.
RankResult run_rank(const ep::EpLayerWeights& weights, const ep::EpInputs& inputs, Entry entry, ncclComm_t comm,
                    int rank, int world, const EpOptions& options, cudaStream_t stream, int runs = 1,
                    bool in_place = false) {
  const MoeSpec& spec = weights.spec;
  const std::size_t out_count = static_cast<std::size_t>(inputs.num_tokens) * spec.hidden;
  EpMoeLayer layer(spec, rank, world, comm, options);
  DeviceBuffer workspace(layer.workspace_bytes());
  DeviceBuffer out(std::max<std::size_t>(out_count, 1) * 2), counter(4);
  DeviceBuffer x_copy(std::max<std::size_t>(out_count, 1) * 2);
  RankResult result;
  for (int run = 0; run < runs; ++run) {
    EpRunArgs args;
    args.num_tokens = inputs.num_tokens;
    args.x = inputs.x.get();
    args.out = out.get();
    if (in_place) {
      HMOE_CUDA_CHECK(cudaMemcpyAsync(x_copy.get(), inputs.x.get(), out_count * 2, cudaMemcpyDeviceToDevice, stream));
      args.x = args.out = x_copy.get();
    } else {
      testkit::poison_bf16(out.get(), out_count, stream);
    }
    args.weights = weights.local();
    args.workspace = workspace.get();
    args.workspace_size = workspace.bytes();
    args.invalid_id_count = counter.as<int>();
    HMOE_CUDA_CHECK(cudaMemsetAsync(counter.get(), 0, 4, stream));
    if (entry == Entry::kTopK)
      layer.run_from_topk(args, inputs.topk_ids.as<const std::int32_t>(), inputs.topk_weights.as<const float>(),
                          stream);
    else
      layer.run_from_logits(args, inputs.logits.get(), stream);
    std::vector<std::uint16_t> run_out =
        testkit::copy_to_host<std::uint16_t>(in_place ? x_copy.get() : out.get(), out_count, stream);
    if (run > 0) EXPECT_TRUE(run_out == result.ep_out) << "run " << run << " differs from run 0";
    result.ep_out = std::move(run_out);
  }
  result.ep_invalid = to_host<int>(counter, 1, stream)[0];
  result.exchange = layer.last_exchange();

  const MoeRunner single(spec, PlanOptions{std::max(inputs.num_tokens, 1)});
  DeviceBuffer single_workspace(single.workspace_bytes());
  RunArgs args;
  args.num_tokens = inputs.num_tokens;
  args.x = inputs.x.get();
  args.out = out.get();
  args.weights = weights.whole();
  args.workspace = single_workspace.get();
  args.workspace_size = single_workspace.bytes();
  args.invalid_id_count = counter.as<int>();
  HMOE_CUDA_CHECK(cudaMemsetAsync(counter.get(), 0, 4, stream));
  if (inputs.num_tokens > 0) {
    testkit::poison_bf16(out.get(), out_count, stream);
    if (entry == Entry::kTopK)
      single.run_from_topk(args, inputs.topk_ids.as<const std::int32_t>(), inputs.topk_weights.as<const float>(),
                           stream);
    else
      single.run_from_logits(args, inputs.logits.get(), stream);
  }
  result.single_out = testkit::copy_to_host<std::uint16_t>(out.get(), out_count, stream);
  result.single_invalid = to_host<int>(counter, 1, stream)[0];
  return result;
}

EpOptions ep_options(int max_tokens, EpDispatchDType dispatch = EpDispatchDType::kBF16) {
  EpOptions options;
  options.max_tokens_per_rank = std::max(max_tokens, 1);
  options.dispatch_dtype = dispatch;
  return options;
}

// A communicator of one rank on the current device.
struct SingleRankComm {
  ncclComm_t comm = nullptr;
  SingleRankComm() {
    int device = 0;
    HMOE_CUDA_CHECK(cudaGetDevice(&device));
    const ncclResult_t status = ncclCommInitAll(&comm, 1, &device);
    if (status != ncclSuccess) throw Error(std::string("ncclCommInitAll: ") + ncclGetErrorString(status));
  }
  ~SingleRankComm() {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
};

void expect_matches_single(const RankResult& result, double bound, const std::string& what) {
  const OutputComparison comparison = compare_outputs(result.single_out, result.ep_out);
  std::cout << "  " << what << ": EP vs single-GPU layer " << comparison.summary() << "\n";
  EXPECT_EQ(comparison.unwritten, 0u) << what;
  EXPECT_EQ(comparison.nonfinite, 0u) << what;
  EXPECT_LE(comparison.rel_error, bound) << what << ": " << comparison.summary();
  EXPECT_EQ(result.ep_invalid, result.single_invalid) << what;
}

struct OneGpuCase {
  std::string preset_name;
  int num_tokens = 0;
  RoutingMode routing = RoutingMode::kUniform;
  Entry entry = Entry::kTopK;
};

void PrintTo(const OneGpuCase& c, std::ostream* os) {
  *os << c.preset_name << " T=" << c.num_tokens << " " << testkit::to_string(c.routing)
      << (c.entry == Entry::kTopK ? " topk" : " logits");
}

std::string one_gpu_case_name(const testing::TestParamInfo<OneGpuCase>& info) {
  std::string name = info.param.preset_name + "_T" + std::to_string(info.param.num_tokens) + "_" +
                     testkit::to_string(info.param.routing) + (info.param.entry == Entry::kTopK ? "_topk" : "_logits");
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

std::vector<OneGpuCase> one_gpu_cases() {
  std::vector<OneGpuCase> cases;
  for (const char* name : {"qwen3-30b-a3b", "deepseek-v3-tp8"}) {
    for (int tokens : {1, 64, 1000})
      for (Entry entry : {Entry::kTopK, Entry::kLogits}) cases.push_back({name, tokens, RoutingMode::kUniform, entry});
    for (RoutingMode routing : {RoutingMode::kZipf, RoutingMode::kExtreme})
      cases.push_back({name, 1000, routing, Entry::kLogits});
  }
  return cases;
}

class EpOneGpu : public testing::TestWithParam<OneGpuCase> {};

TEST_P(EpOneGpu, MatchesTheSingleGpuLayer) {
  HMOE_REQUIRE_HOPPER_GPU();
  const OneGpuCase& c = GetParam();
  const testkit::Stream stream;
  const SingleRankComm nccl;
  const ep::EpLayerWeights weights = ep::make_ep_layer_weights(preset(c.preset_name), 0, 1, kWeightSeed, stream.get());
  const ep::EpInputs inputs = ep::make_ep_inputs(weights, c.num_tokens, c.routing, 100 + c.num_tokens, stream.get());
  const RankResult result =
      run_rank(weights, inputs, c.entry, nccl.comm, 0, 1, ep_options(c.num_tokens), stream.get(), /*runs=*/2);
  expect_matches_single(result, testkit::kBf16Tolerance, c.preset_name + " T=" + std::to_string(c.num_tokens));
  EXPECT_EQ(result.exchange.sent_rows, std::vector<int>{c.num_tokens * weights.spec.top_k});
  EXPECT_EQ(result.exchange.received_rows, result.exchange.sent_rows);
}

INSTANTIATE_TEST_SUITE_P(Presets, EpOneGpu, testing::ValuesIn(one_gpu_cases()), one_gpu_case_name);

TEST(EpOneGpuEdges, InvalidIdsNoTokensAndInPlace) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream;
  const SingleRankComm nccl;
  const ep::EpLayerWeights weights =
      ep::make_ep_layer_weights(preset("qwen3-30b-a3b"), 0, 1, kWeightSeed, stream.get());
  ep::EpInputs inputs = ep::make_ep_inputs(weights, 64, RoutingMode::kUniform, 5, stream.get());
  std::vector<std::int32_t> ids;
  std::vector<float> topk_weights;
  host_topk(weights.spec, 64, RoutingMode::kUniform, 5, 3, ids, topk_weights, stream.get());
  testkit::copy_to_device(inputs.topk_ids.get(), ids, stream.get());
  testkit::copy_to_device(inputs.topk_weights.get(), topk_weights, stream.get());
  const RankResult invalid = run_rank(weights, inputs, Entry::kTopK, nccl.comm, 0, 1, ep_options(64), stream.get());
  expect_matches_single(invalid, testkit::kBf16Tolerance, "invalid ids");
  EXPECT_GT(invalid.ep_invalid, 0);

  const RankResult in_place = run_rank(weights, inputs, Entry::kTopK, nccl.comm, 0, 1, ep_options(64), stream.get(), 2,
                                       /*in_place=*/true);
  EXPECT_TRUE(in_place.ep_out == invalid.ep_out) << "out == x gives the same bits";

  const ep::EpInputs none = ep::make_ep_inputs(weights, 0, RoutingMode::kUniform, 6, stream.get());
  const RankResult empty = run_rank(weights, none, Entry::kLogits, nccl.comm, 0, 1, ep_options(64), stream.get());
  EXPECT_EQ(empty.exchange.sent_rows, std::vector<int>{0});
}

TEST(EpOneGpuEdges, Fp8Dispatch) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream;
  const SingleRankComm nccl;
  // bf16 layer: one e4m3 rounding of x costs ~4% (tests/cpu/test_ep.cpp measures it on the host).
  {
    const ep::EpLayerWeights weights =
        ep::make_ep_layer_weights(preset("deepseek-v3-tp8"), 0, 1, kWeightSeed, stream.get());
    const ep::EpInputs inputs = ep::make_ep_inputs(weights, 64, RoutingMode::kUniform, 8, stream.get());
    const RankResult result = run_rank(weights, inputs, Entry::kLogits, nccl.comm, 0, 1,
                                       ep_options(64, EpDispatchDType::kFP8Block128), stream.get());
    expect_matches_single(result, 6e-2, "bf16 layer, fp8 dispatch");
  }
  // fp8-block layers: the dispatch round trip is lossless (the CPU simulation shows it bit for bit).
  for (bool ue8m0 : {false, true}) {
    MoeSpec spec = preset("deepseek-v3-tp8");
    spec.weight_dtype = WeightDType::kFP8E4M3;
    spec.scheme = QuantScheme::kBlock128;
    spec.ue8m0_scales = ue8m0;
    const ep::EpLayerWeights weights = ep::make_ep_layer_weights(spec, 0, 1, kWeightSeed, stream.get());
    const ep::EpInputs inputs = ep::make_ep_inputs(weights, 64, RoutingMode::kUniform, 9, stream.get());
    const RankResult result = run_rank(weights, inputs, Entry::kLogits, nccl.comm, 0, 1,
                                       ep_options(64, EpDispatchDType::kFP8Block128), stream.get());
    expect_matches_single(result, testkit::kFp8Tolerance, ue8m0 ? "fp8-block ue8m0 layer, fp8 dispatch"
                                                                : "fp8-block layer, fp8 dispatch");
  }
}

// Two-batch overlap on one rank: three micro-batches of different sizes through run_overlapped
// give, batch by batch, the bits run_from_topk gives each alone (bf16 and fp8 dispatch).
TEST(EpOneGpuEdges, OverlappedMicroBatchesMatchSequentialRuns) {
  HMOE_REQUIRE_HOPPER_GPU();
  const testkit::Stream stream, comm_stream;
  const SingleRankComm nccl;
  for (const char* preset_name : {"qwen3-30b-a3b", "deepseek-v3-tp8"}) {
    for (EpDispatchDType dispatch : {EpDispatchDType::kBF16, EpDispatchDType::kFP8Block128}) {
      const ep::EpLayerWeights weights = ep::make_ep_layer_weights(preset(preset_name), 0, 1, kWeightSeed, stream.get());
      const std::vector<int> sizes = {64, 1, 1000};
      EpMoeLayer layer(weights.spec, 0, 1, nccl.comm, ep_options(1000, dispatch));
      std::vector<ep::EpInputs> inputs;
      std::vector<DeviceBuffer> workspaces, outs;
      std::vector<EpMicroBatch> batches;
      for (std::size_t b = 0; b < sizes.size(); ++b) {
        inputs.push_back(ep::make_ep_inputs(weights, sizes[b], RoutingMode::kUniform, 300 + b, stream.get()));
        workspaces.emplace_back(layer.workspace_bytes());
        outs.emplace_back(static_cast<std::size_t>(sizes[b]) * weights.spec.hidden * 2);
      }
      for (std::size_t b = 0; b < sizes.size(); ++b) {
        EpMicroBatch batch;
        batch.args.num_tokens = sizes[b];
        batch.args.x = inputs[b].x.get();
        batch.args.out = outs[b].get();
        batch.args.weights = weights.local();
        batch.args.workspace = workspaces[b].get();
        batch.args.workspace_size = workspaces[b].bytes();
        batch.topk_ids = inputs[b].topk_ids.as<const std::int32_t>();
        batch.topk_weights = inputs[b].topk_weights.as<const float>();
        batches.push_back(batch);
      }
      std::vector<std::vector<std::uint16_t>> sequential;
      for (std::size_t b = 0; b < sizes.size(); ++b) {
        const std::size_t count = static_cast<std::size_t>(sizes[b]) * weights.spec.hidden;
        testkit::poison_bf16(outs[b].get(), count, stream.get());
        layer.run_from_topk(batches[b].args, batches[b].topk_ids, batches[b].topk_weights, stream.get());
        sequential.push_back(testkit::copy_to_host<std::uint16_t>(outs[b].get(), count, stream.get()));
      }
      for (std::size_t b = 0; b < sizes.size(); ++b)
        testkit::poison_bf16(outs[b].get(), static_cast<std::size_t>(sizes[b]) * weights.spec.hidden, stream.get());
      layer.run_overlapped(batches, stream.get(), comm_stream.get());
      for (std::size_t b = 0; b < sizes.size(); ++b) {
        const std::vector<std::uint16_t> overlapped = testkit::copy_to_host<std::uint16_t>(
            outs[b].get(), static_cast<std::size_t>(sizes[b]) * weights.spec.hidden, stream.get());
        EXPECT_TRUE(overlapped == sequential[b]) << preset_name << " micro-batch " << b << " (T=" << sizes[b]
                                                 << "): overlapped output differs from the sequential run";
      }
      EXPECT_EQ(layer.last_exchange().sent_rows, std::vector<int>{sizes.back() * weights.spec.top_k});
      // The same workspace twice is refused before anything is enqueued.
      std::vector<EpMicroBatch> shared = {batches[0], batches[1]};
      shared[1].args.workspace = shared[0].args.workspace;
      EXPECT_THROW(layer.run_overlapped(shared, stream.get(), comm_stream.get()), Error);
      EXPECT_THROW(layer.run_overlapped(batches, stream.get(), stream.get()), Error);
    }
  }
}

// ---- Several GPUs, one thread per rank -------------------------------------------------------

TEST(EpMultiGpu, MatchesTheSingleGpuLayer) {
  HMOE_REQUIRE_HOPPER_GPU();
  int devices = 0;
  HMOE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices < 2) GTEST_SKIP() << "one GPU: the multi-rank path needs 2, 4 or 8 (examples/ep_moe runs it too)";
  int world = 1;
  while (world * 2 <= std::min(devices, 8)) world *= 2;
  std::vector<int> device_list(world);
  for (int r = 0; r < world; ++r) device_list[r] = r;
  std::vector<ncclComm_t> comms(world);
  HMOE_TEST_NCCL(ncclCommInitAll(comms.data(), world, device_list.data()));

  std::mutex report;
  std::atomic<bool> aborted{false};
  std::vector<std::exception_ptr> errors(world);
  // A rank that fails aborts every communicator, so its peers leave their exchanges with an error
  // instead of waiting for it forever.
  const auto abort_all = [&] {
    if (!aborted.exchange(true))
      for (ncclComm_t comm : comms) ncclCommAbort(comm);
  };
  for (const char* preset_name : {"qwen3-30b-a3b", "deepseek-v3-tp8"}) {
    for (int tokens : {1, 64, 1000}) {
      if (aborted) break;
      std::vector<std::thread> threads;
      for (int rank = 0; rank < world; ++rank) {
        threads.emplace_back([&, rank] {
          try {
            HMOE_CUDA_CHECK(cudaSetDevice(device_list[rank]));
            const testkit::Stream stream;
            const ep::EpLayerWeights weights =
                ep::make_ep_layer_weights(preset(preset_name), rank, world, kWeightSeed, stream.get());
            // Different T per rank (rank 1 has none at T = 1) and different tokens on every rank.
            const int rank_tokens = tokens == 1 && rank == 1 ? 0 : tokens + rank;
            const ep::EpInputs inputs =
                ep::make_ep_inputs(weights, rank_tokens, RoutingMode::kUniform, 1000 * rank + tokens, stream.get());
            const RankResult result = run_rank(weights, inputs, Entry::kLogits, comms[rank], rank, world,
                                               ep_options(tokens + world), stream.get(), /*runs=*/2);
            const OutputComparison comparison = compare_outputs(result.single_out, result.ep_out);
            const std::lock_guard<std::mutex> lock(report);
            const std::string what = std::string(preset_name) + " R=" + std::to_string(world) + " rank " +
                                     std::to_string(rank) + " T=" + std::to_string(rank_tokens);
            std::cout << "  " << what << ": " << comparison.summary() << "\n";
            EXPECT_EQ(comparison.unwritten, 0u) << what;
            EXPECT_EQ(comparison.nonfinite, 0u) << what;
            EXPECT_LE(comparison.rel_error, testkit::kBf16Tolerance) << what;
          } catch (...) {
            errors[rank] = std::current_exception();
            abort_all();
          }
        });
      }
      for (std::thread& thread : threads) thread.join();
    }
  }
  for (int rank = 0; rank < world; ++rank) {
    if (!errors[rank]) continue;
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "rank " << rank << ": " << error.what();
    }
  }
  if (!aborted)
    for (ncclComm_t comm : comms) ncclCommDestroy(comm);
}

}  // namespace
}  // namespace hmoe::test
