// `hmoe bench`: times one preset over a token sweep as CUDA-graph replays and prints each row
// against the floor of DESIGN.md §4, with the ceilings and the card it was measured on.
#include <cstdio>
#include <exception>
#include <iostream>

#include "cli.hpp"
#include "dispatch/tuned_table.hpp"
#include "testkit/bench.hpp"
#include "testkit/ceilings.hpp"
#include "testkit/device.hpp"
#include "testkit/host_overhead.hpp"

namespace hmoe::cli {
namespace {

// DESIGN.md §3: decode 1…256, prefill 512…16384.
constexpr const char* kDefaultSweep = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384";

// Host overhead: decode, the Swap-AB range, the crossover, prefill.
constexpr const char* kHostOverheadSweep = "1,16,256,4096";
constexpr int kHostOverheadCalls = 2000;

constexpr const char* kBenchUsage =
    "usage: hmoe bench --model PRESET [--tokens T[,T...]] [--dtype bf16] [--routing uniform|zipf|extreme]\n"
    "                  [--orientation auto|normal|swap] [--seed N] [--explain | --host-overhead]\n"
    "  --model        a preset of DESIGN.md §3 (hmoe info lists them)\n"
    "  --tokens       token counts (default the DESIGN.md §3 sweep 1,2,4,...,16384)\n"
    "  --dtype        weight/activation type (default bf16; FP8 is not implemented yet)\n"
    "  --routing      expert load: uniform random (default), zipf popularity, or extreme (all to the same k)\n"
    "  --orientation  GEMM orientation the runner is planned with (default auto)\n"
    "  --seed         seed of weights and inputs (default 1)\n"
    "  --explain      print, per T, the kernel variant pair the runner plans and who chose it (tuned\n"
    "                 table or analytic rule), then exit without timing; works without a GPU (then no\n"
    "                 tuned table applies: tables are per device)\n"
    "  --host-overhead  CPU time per run_from_logits call and per graph launch (median of 2000, the\n"
    "                 stream synchronised every 32 calls outside the timed region), and launches per\n"
    "                 layer (kernel nodes of a captured layer); default tokens 1,16,256,4096\n"
    "measures the card's ceilings first (copy and read-only bandwidth, bf16 GEMM), then times\n"
    "run_from_logits replays over 4 rotating input sets; exit 1 if no Hopper GPU, 2 on bad usage\n";

struct BenchCommand {
  std::string preset_name;
  MoeSpec spec;
  testkit::BenchOptions options;
  bool explain = false;
  bool host_overhead = false;
};

BenchCommand parse_bench(const ParsedOptions& parsed) {
  if (!parsed.has("--model")) throw UsageError("missing --model PRESET");
  BenchCommand command;
  command.preset_name = parsed.get("--model", "");
  command.spec = parse_preset(command.preset_name);
  command.explain = parsed.flag("--explain");
  command.host_overhead = parsed.flag("--host-overhead");
  if (command.explain && command.host_overhead) throw UsageError("--explain and --host-overhead exclude each other");
  command.options.token_counts =
      parse_token_list(parsed.get("--tokens", command.host_overhead ? kHostOverheadSweep : kDefaultSweep));
  require_bf16(parsed.get("--dtype", "bf16"));
  command.options.routing = parse_routing(parsed.get("--routing", "uniform"));
  command.options.orientation = parse_orientation(parsed.get("--orientation", "auto"));
  command.options.seed = parse_seed(parsed.get("--seed", "1"));
  return command;
}

void print_header(const BenchCommand& command, const std::vector<std::string>& args) {
  std::string command_line = "hmoe bench";
  for (const std::string& arg : args) command_line += " " + arg;
  const MoeSpec& spec = command.spec;
  const testkit::Ceilings& ceilings = testkit::measured_ceilings();
  std::printf("command: %s\n", command_line.c_str());
  std::printf("device: %s\n", testkit::describe(testkit::current_device_info()).c_str());
  std::printf("ceilings: d2d copy %.0f GB/s (read+write), read-only stream %.0f GB/s -> floor uses %.0f GB/s; "
              "bf16 GEMM 8192^3 %.1f TFLOP/s\n",
              ceilings.copy_gb_per_s, ceilings.read_gb_per_s, ceilings.bandwidth_gb_per_s(),
              ceilings.bf16_gemm_tflop_per_s);
  std::printf("layer: %s bf16 E=%d k=%d H=%d I=%d %s; routing %s; orientation %s; %d input sets; CUDA graph replays\n",
              command.preset_name.c_str(), spec.num_experts, spec.top_k, spec.hidden, spec.intermediate,
              to_string(spec.routing.function).c_str(), testkit::to_string(command.options.routing).c_str(),
              to_string(command.options.orientation).c_str(), command.options.input_sets);
  std::printf("%6s %11s %21s %8s %8s %9s %7s %8s  %s\n", "T", "median_us", "p10-p90_us", "TFLOP/s", "GB/s",
              "floor_us", "%floor", "experts", "plan (orientation weight_tile x token_tile) [chosen by]");
  std::fflush(stdout);
}

void print_row(const testkit::BenchRow& row) {
  char spread[64];
  std::snprintf(spread, sizeof(spread), "%.1f-%.1f", row.p10_us, row.p90_us);
  std::printf("%6d %11.1f %21s %8.1f %8.0f %9.1f %6.0f%% %8.1f  %s [%s]\n", row.num_tokens, row.median_us, spread,
              row.tflop_per_s, row.gb_per_s, row.floor_us, row.percent_of_floor, row.experts_hit,
              plan_summary(row.plan).c_str(), row.plan.source.substr(0, row.plan.source.find(':')).c_str());
  std::fflush(stdout);
}

// --explain: the plan per T and who chose it, without running anything.
int explain(const BenchCommand& command) {
  std::string reason;
  const bool gpu = testkit::hopper_gpu_available(&reason);
  std::printf("layer: %s bf16 E=%d k=%d H=%d I=%d; orientation %s\n", command.preset_name.c_str(),
              command.spec.num_experts, command.spec.top_k, command.spec.hidden, command.spec.intermediate,
              to_string(command.options.orientation).c_str());
  if (gpu) {
    std::printf("device: %s; tuned table looked up as %s\n", testkit::current_device_info().name.c_str(),
                dispatch::tuned_file_name(command.spec, dispatch::current_device_name()).c_str());
  } else {
    std::printf("device: none (%s): tuned tables are per device, so the analytic rule decides\n", reason.c_str());
  }
  std::printf("%6s %12s  %-20s %-28s %-28s %s\n", "T", "tokens/exp", "plan", "gemm1", "gemm2", "source");
  for (int num_tokens : command.options.token_counts) {
    PlanOptions plan_options;
    plan_options.max_tokens = num_tokens;
    plan_options.orientation = command.options.orientation;
    const PlanInfo plan = MoeRunner(command.spec, plan_options).plan_info(num_tokens);
    std::printf("%6d %12.2f  %-20s %-28s %-28s %s\n", num_tokens,
                static_cast<double>(num_tokens) * command.spec.top_k / command.spec.num_experts,
                plan_summary(plan).c_str(), plan.gemm1_kernel.c_str(), plan.gemm2_kernel.c_str(), plan.source.c_str());
  }
  return 0;
}

// --host-overhead: CPU cost of enqueuing one layer, and its launch count.
void host_overhead(const BenchCommand& command) {
  std::printf("device: %s\n", testkit::describe(testkit::current_device_info()).c_str());
  std::printf("layer: %s bf16; CPU time per call (steady clock), %d calls each, stream synchronised every 32 calls "
              "outside the timed region\n",
              command.preset_name.c_str(), kHostOverheadCalls);
  std::printf("%6s %16s %13s %18s %9s %6s  %s\n", "T", "run_median_us", "run_p90_us", "graph_launch_us",
              "kernels", "nodes", "plan");
  testkit::LayerWeights weights;
  {
    const testkit::Stream stream;
    weights = testkit::make_layer_weights(command.spec, command.options.seed, false, stream.get());
    stream.synchronize();
  }
  for (int num_tokens : command.options.token_counts) {
    const testkit::HostOverhead row = testkit::measure_host_overhead(weights, num_tokens, kHostOverheadCalls);
    PlanOptions plan_options;
    plan_options.max_tokens = num_tokens;
    std::printf("%6d %16.2f %13.2f %18.2f %9d %6d  %s\n", row.num_tokens, row.run_median_us, row.run_p90_us,
                row.graph_launch_median_us, row.kernel_launches, row.graph_nodes,
                plan_summary(MoeRunner(command.spec, plan_options).plan_info(num_tokens)).c_str());
    std::fflush(stdout);
  }
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  BenchCommand command;
  try {
    const ParsedOptions parsed = parse_options(args, {"--model", "--tokens", "--dtype", "--routing", "--orientation", "--seed"},
                                               {"--explain", "--host-overhead"});
    if (parsed.help) {
      std::cout << kBenchUsage;
      return 0;
    }
    command = parse_bench(parsed);
  } catch (const UsageError& error) {
    return usage_error("bench", error.what(), kBenchUsage);
  }
  if (command.explain) return explain(command);
  if (report_if_no_hopper_gpu("bench")) return kExitFailure;

  try {
    if (command.host_overhead) {
      host_overhead(command);
      return 0;
    }
    print_header(command, args);
    testkit::bench_layer(command.spec, command.options, print_row);
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "hmoe bench: error: " << error.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace hmoe::cli
