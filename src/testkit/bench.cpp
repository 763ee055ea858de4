// bench_layer: graph-replay timing of MoeRunner::run_from_logits over a token sweep.
#include "testkit/bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "testkit/ceilings.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/layer_data.hpp"
#include "testkit/replay_timing.hpp"

namespace hmoe::testkit {
namespace {

std::vector<int> count_tokens_per_expert(const reference::Routing& routing, int num_experts) {
  std::vector<int> counts(num_experts, 0);
  for (std::int32_t id : routing.ids)
    if (id >= 0 && id < num_experts) ++counts[id];
  return counts;
}

// One input set, the output its replays write, and what the floor counts for it.
struct ReplaySet {
  LayerInputs inputs;
  DeviceBuffer out;
  DeviceBuffer own_workspace;          // skip_stages only: each set keeps its own full run's state
  double bytes_touched = 0.0;
  int experts_hit = 0;
  std::vector<int> tokens_per_expert;  // measure_floor only
};

// The FP8 compute floor's peak: the measured cuBLASLt e4m3 GEMM, or, where cuBLASLt cannot run it,
// twice the bf16 peak (Hopper's dense FP8 rate), said once on stderr.
double fp8_matrix_peak(const Ceilings& ceilings) {
  static const double peak = [&ceilings] {
    try {
      return measured_fp8_gemm_tflop_per_s();
    } catch (const Error& error) {
      std::fprintf(stderr, "hmoe bench: fp8 GEMM ceiling not measured (%s): FP8 floors use 2 x the bf16 peak\n",
                   error.what());
      return 2.0 * ceilings.bf16_gemm_tflop_per_s;
    }
  }();
  return peak;
}

}  // namespace

std::vector<BenchRow> bench_layer(const MoeSpec& spec, const BenchOptions& options,
                                  const std::function<void(const BenchRow&)>& on_row) {
  LayerWeights weights;
  {
    const Stream stream;
    weights = make_layer_weights(spec, options.seed, /*keep_host_copy=*/false, stream.get());
    stream.synchronize();  // the runs go to another stream
  }
  return bench_layer(weights, options, on_row);
}

std::vector<BenchRow> bench_layer(const LayerWeights& weights, const BenchOptions& options,
                                  const std::function<void(const BenchRow&)>& on_row) {
  if (options.input_sets < 1) throw Error("hmoe testkit: bench_layer needs input_sets >= 1");
  const MoeSpec& spec = weights.spec;
  const Ceilings no_ceilings;
  const Ceilings& ceilings = options.measure_floor ? measured_ceilings() : no_ceilings;
  Stream stream;
  // Weight bytes of one expert: its values, plus its scales for FP8.
  const bool fp8 = spec.weight_dtype == WeightDType::kFP8E4M3;
  const double expert_bytes =
      3.0 * spec.hidden * static_cast<double>(spec.intermediate) * (fp8 ? 1 : sizeof(std::uint16_t)) +
      (fp8 ? 4.0 * (weight_scale_count(spec, WeightMatrix::kW13) + weight_scale_count(spec, WeightMatrix::kW2)) /
                 spec.num_experts
           : 0.0);
  const double matrix_peak_tflop_per_s =
      !options.measure_floor ? 0.0 : fp8 ? fp8_matrix_peak(ceilings) : ceilings.bf16_gemm_tflop_per_s;

  std::vector<BenchRow> rows;
  for (int num_tokens : options.token_counts) {
    if (num_tokens < 1) throw Error("hmoe testkit: bench_layer token counts must be >= 1");
    PlanOptions plan_options;
    plan_options.max_tokens = num_tokens;
    plan_options.orientation = options.orientation;
    plan_options.force_variant = options.force_variant;
    plan_options.split_k = options.split_k;
    plan_options.fused_decode = options.fused_decode;
    std::optional<MoeRunner> full_runner;   // --skip only: fills each set's workspace once
    if (options.skip_stages != 0) {
      // The skipping runner runs the unfused kernels (PlanOptions::fused_decode): so must its full run.
      plan_options.fused_decode = FusedDecode::kOff;
      full_runner.emplace(spec, plan_options);
    }
    plan_options.skip_stages = options.skip_stages;
    const MoeRunner runner(spec, plan_options);
    DeviceBuffer workspace(runner.workspace_bytes());
    const double activation_bytes = 2.0 * num_tokens * static_cast<double>(spec.hidden) * sizeof(std::uint16_t);
    const double flops = 6.0 * num_tokens * spec.top_k * static_cast<double>(spec.hidden) * spec.intermediate;

    std::vector<ReplaySet> sets;
    std::vector<GraphExec> graphs;
    for (int index = 0; index < options.input_sets; ++index) {
      const RoutingDraw draw{options.routing, options.seed, options.seed + 1 + static_cast<std::uint64_t>(index)};
      ReplaySet set;
      set.inputs = make_layer_inputs(weights, num_tokens, Entry::kLogits, draw, stream.get());
      set.out = DeviceBuffer(static_cast<std::size_t>(num_tokens) * spec.hidden * sizeof(std::uint16_t));
      if (options.measure_floor) {
        set.tokens_per_expert = count_tokens_per_expert(host_routing(weights, set.inputs, stream.get()), spec.num_experts);
        set.experts_hit = static_cast<int>(
            std::count_if(set.tokens_per_expert.begin(), set.tokens_per_expert.end(), [](int count) { return count > 0; }));
      }
      set.bytes_touched = set.experts_hit * expert_bytes + activation_bytes;
      RunArgs args = run_args(weights, set.inputs, set.out.get());
      args.workspace = workspace.get();
      args.workspace_size = workspace.bytes();
      const void* logits = set.inputs.router_logits.get();
      if (options.skip_stages != 0) {
        // What the skipped stages would have produced comes from one full run of this set, in a
        // workspace of its own (a shared one would hand every set the last set's routing).
        set.own_workspace = DeviceBuffer(runner.workspace_bytes());
        args.workspace = set.own_workspace.get();
        full_runner->run_from_logits(args, logits, stream.get());
      }
      graphs.push_back(GraphExec::capture(stream.get(), [&] { runner.run_from_logits(args, logits, stream.get()); }));
      sets.push_back(std::move(set));
    }

    const ReplayTiming timing =
        time_graph_replays(graphs, options.seconds_per_point, options.min_replays, stream.get(),
                          options.warmup_seconds);

    BenchRow row;
    row.num_tokens = num_tokens;
    row.replays = timing.replays;
    row.median_us = timing.median_us;
    row.p10_us = timing.p10_us;
    row.p90_us = timing.p90_us;
    const double compute_floor_us =
        options.measure_floor ? flops / (matrix_peak_tflop_per_s * 1e12) * 1e6 : 0.0;
    for (const ReplaySet& set : sets) {
      if (!options.measure_floor) break;
      row.bytes_touched += set.bytes_touched / sets.size();
      row.experts_hit += static_cast<double>(set.experts_hit) / sets.size();
      const double memory_floor_us = set.bytes_touched / (ceilings.bandwidth_gb_per_s() * 1e9) * 1e6;
      row.floor_us += std::max(memory_floor_us, compute_floor_us) / sets.size();
      row.tokens_per_expert.push_back(set.tokens_per_expert);
    }
    row.tflop_per_s = flops / (row.median_us * 1e-6) / 1e12;
    row.gb_per_s = row.bytes_touched / (row.median_us * 1e-6) / 1e9;
    row.percent_of_floor = 100.0 * row.floor_us / row.median_us;
    row.plan = runner.plan_info(num_tokens);
    if (on_row) on_row(row);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace hmoe::testkit
