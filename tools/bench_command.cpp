// `hmoe bench`: times one layer (a preset or an E,k,H,I spec) over a token sweep as CUDA-graph
// replays and prints each row against the floor of DESIGN.md §4, with the ceilings and the card it
// was measured on; optionally beside a cuBLAS per-expert peer, over a whole model (--e2e), as JSON/CSV.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "cli.hpp"
#include "dispatch/registry.hpp"
#include "dispatch/tuned_table.hpp"
#include "testkit/bench.hpp"
#include "testkit/bench_report.hpp"
#include "testkit/ceilings.hpp"
#include "testkit/cublas_peer.hpp"
#include "testkit/device.hpp"
#include "testkit/host_overhead.hpp"
#include "testkit/model_layers.hpp"

namespace hmoe::cli {
namespace {

// DESIGN.md §3: decode 1…256, prefill 512…16384.
constexpr const char* kDefaultSweep = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384";
// --e2e: a token count up to this is one decode step at batch B, above it a prefill of P tokens.
constexpr int kLargestDecodeBatch = 256;

// Host overhead: decode, the Swap-AB range, the crossover, prefill.
constexpr const char* kHostOverheadSweep = "1,16,256,4096";
constexpr int kHostOverheadCalls = 2000;

constexpr const char* kBenchUsage =
    "usage: hmoe bench (--model PRESET | --spec E,k,H,I) [--tokens T[,T...]] [--dtype DTYPE]\n"
    "                  [--routing uniform|zipf|extreme] [--orientation auto|normal|swap] [--seed N]\n"
    "                  [--batch-invariant] [--split-k auto|N] [--fused-decode auto|on|off] [--peers cublas]\n"
    "                  [--variant GEMM1+GEMM2] [--static-scales]\n"
    "                  [--e2e] [--json FILE]\n"
    "                  [--csv FILE]\n"
    "                  [--explain | --host-overhead | --skip STAGE[,STAGE...]]\n"
    "       hmoe bench --ceilings [--json FILE]\n"
    "  --model        a preset of DESIGN.md §3 (hmoe info lists them)\n"
    "  --spec         a layer given as E,k,H,I (softmax top-k routing, renormalised)\n"
    "  --tokens       token counts (default the DESIGN.md §3 sweep 1,2,4,...,16384)\n"
    "  --dtype        bf16 (default), fp8-tensor (per-tensor scales), fp8-channel (per-channel weights x\n"
    "                 per-token activations), fp8-block (128x128 weight blocks x 1x128 activation groups)\n"
    "  --routing      expert load: uniform random (default), zipf popularity, or extreme (all to the same k)\n"
    "  --orientation  GEMM orientation the runner is planned with (default auto)\n"
    "  --seed         seed of weights and inputs (default 1)\n"
    "  --batch-invariant  plan with MoeSpec::batch_invariant (one fixed variant for every T), to measure\n"
    "                 what batch invariance costs\n"
    "  --split-k      ways the Swap-AB GEMMs split K over CTAs: auto (default, hmoe's rule at decode\n"
    "                 sizes), 1 (never) or at most N (wherever a Swap-AB variant runs, capped by K and the\n"
    "                 split workspace); the plan column shows split-K G1/G2 when a GEMM splits, and\n"
    "                 \"(asked N)\" when either split fewer ways\n"
    "  --fused-decode the whole layer as one kernel at T <= 4 (PlanOptions::fused_decode): auto (default:\n"
    "                 where this device's tuned table says so), on (wherever it applies) or off; the plan\n"
    "                 column shows \"fused layer\" (HMOE_FUSED_DECODE=1/0 overrides it, as for every runner)\n"
    "  --variant      plan every T with this kernel pair (PlanOptions::force_variant, as `hmoe tune` does;\n"
    "                 names from `hmoe info --kernels`, e.g. swiglu_normal_t128_w128_fp8block+\n"
    "                 weighted_normal_t128_w128_fp8block): A/B one variant against another on the same\n"
    "                 binary; the plan column says [forced]; implies --fused-decode off\n"
    "  --static-scales  fp8-tensor: static activation scales (vLLM's a1_scale / a2_scale) instead of dynamic\n"
    "                 ones (GEMM1's 256-row tiles then write GEMM2's e4m3 input themselves: \"+requant\";\n"
    "                 HMOE_STATIC_REQUANT=0 keeps the separate pass)\n"
    "  --peers        also time peers on the same card, shapes and expert load: cublas = per expert\n"
    "                 cublasGemmEx GEMM1, one SwiGLU kernel, per expert GEMM2, in a CUDA graph (GEMMs and\n"
    "                 activation only); prints its latency and the ratio hmoe/peer. PyTorch peers:\n"
    "                 bench/peers.py\n"
    "  --e2e          with --model: the MoE share of a forward pass over the model's MoE layers, prefill\n"
    "                 of P = T tokens (T > 256) and one decode step at batch B = T (T <= 256), hmoe vs each\n"
    "                 peer as a speed-up\n"
    "  --json, --csv  also write the rows to FILE (rewritten after each token count)\n"
    "  --explain      print, per T, the kernel variant pair the runner plans and who chose it (tuned\n"
    "                 table or analytic rule; for the \"fused layer\" at T <= 4, who turned it on), then\n"
    "                 exit without timing; works without a GPU (then no tuned table applies: tables are\n"
    "                 per device)\n"
    "  --host-overhead  CPU time per run_from_logits call (eager, and with PlanOptions::replay_graphs)\n"
    "                 and per graph launch (median of 2000, the stream synchronised every 32 calls\n"
    "                 outside the timed region), launches per layer (kernel nodes of a captured\n"
    "                 layer), and the host's floor: one empty launch, one TMA descriptor encode;\n"
    "                 default tokens 1,16,256,4096\n"
    "  --skip         time the layer WITHOUT these stages (routing, permute, quantize-x, gemm1,\n"
    "                 requantize, gemm2, combine) to attribute its time: a full run per input set first\n"
    "                 leaves what the skipped stages would produce; the rows are not a valid layer (no\n"
    "                 --json, --csv, --peers, --e2e)\n"
    "  --ceilings     measure and print the card's ceilings only: device-to-device copy, read-only\n"
    "                 stream, cuBLAS bf16 GEMM 8192^3, cuBLASLt fp8 e4m3 GEMM 8192^3 (per-tensor scales)\n"
    "measures the card's ceilings first (copy and read-only bandwidth, bf16 GEMM), then times\n"
    "run_from_logits replays over 4 rotating input sets; exit 1 if no Hopper GPU, 2 on bad usage\n";

enum class BenchMode { kSweep, kExplain, kHostOverhead, kCeilings };

struct BenchCommand {
  BenchMode mode = BenchMode::kSweep;
  std::string layer_name;           // the preset, or "spec-E..-k..-H..-I.." for --spec
  MoeSpec spec;
  std::optional<int> moe_layers;    // presets only
  testkit::BenchOptions options;
  bool cublas_peer = false;
  bool e2e = false;
  std::string json_path;
  std::string csv_path;
  std::string command_line;
  std::string skip_text;            // --skip as given (empty: a whole layer)
  bool static_scales = false;       // --static-scales (fp8-tensor)
};

// The dtype as reports name it: "(static)" after fp8-tensor with --static-scales.
std::string layer_dtype(const BenchCommand& command) {
  return dtype_name(command.spec) + (command.static_scales ? "(static)" : "");
}

// "E,k,H,I": a softmax top-k layer with renormalised weights; anything hmoe::validate rejects is a
// usage error naming the field.
MoeSpec parse_spec(const std::string& text) {
  std::vector<int> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) values.push_back(parse_positive_int("--spec", item));
  if (values.size() != 4 || text.back() == ',')
    throw UsageError("--spec '" + text + "': expected four positive integers E,k,H,I");
  MoeSpec spec;
  spec.num_experts = values[0];
  spec.top_k = values[1];
  spec.hidden = values[2];
  spec.intermediate = values[3];
  spec.routing.function = RoutingFunction::kSoftmaxTopK;
  spec.routing.renormalize = true;
  try {
    validate(spec);
  } catch (const Error& error) {
    throw UsageError("--spec '" + text + "': " + error.what());
  }
  return spec;
}

// "gemm1,combine" → StageBit mask; each name once, at least one.
std::uint32_t parse_skip(const std::string& text) {
  static const struct {
    const char* name;
    StageBit bit;
  } kStages[] = {{"routing", kStageRouting},   {"permute", kStagePermute}, {"quantize-x", kStageQuantizeX},
                 {"gemm1", kStageGemm1},       {"requantize", kStageRequantize}, {"gemm2", kStageGemm2},
                 {"combine", kStageCombine}};
  std::uint32_t mask = 0;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    std::uint32_t bit = 0;
    for (const auto& stage : kStages)
      if (item == stage.name) bit = stage.bit;
    if (bit == 0)
      throw UsageError("--skip '" + text + "': unknown stage '" + item +
                       "' (expected routing, permute, quantize-x, gemm1, requantize, gemm2 or combine)");
    if ((mask & bit) != 0) throw UsageError("--skip '" + text + "': stage '" + item + "' given twice");
    mask |= bit;
  }
  if (mask == 0 || text.back() == ',') throw UsageError("--skip '" + text + "': expected a comma-separated list of stages");
  return mask;
}

bool parse_peers(const std::string& text) {
  if (text == "cublas") return true;
  if (text == "none") return false;
  throw UsageError("--peers '" + text + "': expected cublas or none (the PyTorch peers run from bench/peers.py)");
}

// --variant: the pair must exist and fit the layer (named in the error otherwise); the plan is then
// fixed, so options that choose plans conflict with it.
void parse_variant(const ParsedOptions& parsed, BenchCommand& command) {
  const std::string text = parsed.get("--variant", "");
  try {
    dispatch::parse_plan_variant(text, command.spec);
  } catch (const Error& error) {
    throw UsageError("--variant '" + text + "': " + error.what());
  }
  if (command.options.orientation != Orientation::kAuto)
    throw UsageError("--variant fixes the orientation: leave out --orientation");
  if (command.spec.batch_invariant)
    throw UsageError("--variant and --batch-invariant exclude each other (batch-invariant mode runs its one fixed variant)");
  if (command.options.fused_decode == FusedDecode::kOn)
    throw UsageError("--variant runs the pair at every T: not with --fused-decode on");
  if (command.mode == BenchMode::kHostOverhead)
    throw UsageError("--host-overhead plans default runners: no --variant");
  command.options.force_variant = text;
  command.options.fused_decode = FusedDecode::kOff;
}

BenchCommand parse_bench(const ParsedOptions& parsed) {
  BenchCommand command;
  const bool explain = parsed.flag("--explain");
  const bool host_overhead = parsed.flag("--host-overhead");
  const bool ceilings = parsed.flag("--ceilings");
  if (explain + host_overhead + ceilings > 1)
    throw UsageError("--explain, --host-overhead and --ceilings exclude each other");
  command.mode = ceilings        ? BenchMode::kCeilings
                 : explain       ? BenchMode::kExplain
                 : host_overhead ? BenchMode::kHostOverhead
                                 : BenchMode::kSweep;
  command.json_path = parsed.get("--json", "");
  command.csv_path = parsed.get("--csv", "");
  if (command.mode == BenchMode::kCeilings) {
    for (const char* option :
         {"--model", "--spec", "--tokens", "--routing", "--orientation", "--peers", "--csv", "--split-k", "--fused-decode",
          "--variant"})
      if (parsed.has(option)) throw UsageError(std::string("--ceilings takes no ") + option);
    for (const char* flag : {"--e2e", "--batch-invariant", "--static-scales"})
      if (parsed.flag(flag)) throw UsageError(std::string("--ceilings takes no ") + flag);
    return command;
  }

  if (parsed.has("--model") == parsed.has("--spec")) throw UsageError("give one of --model PRESET or --spec E,k,H,I");
  if (parsed.has("--model")) {
    command.layer_name = parsed.get("--model", "");
    command.spec = parse_preset(command.layer_name);
    command.moe_layers = testkit::moe_layers(command.layer_name);
  } else {
    command.spec = parse_spec(parsed.get("--spec", ""));
    command.layer_name = "spec-E" + std::to_string(command.spec.num_experts) + "-k" +
                         std::to_string(command.spec.top_k) + "-H" + std::to_string(command.spec.hidden) + "-I" +
                         std::to_string(command.spec.intermediate);
  }
  command.options.token_counts = parse_token_list(
      parsed.get("--tokens", command.mode == BenchMode::kHostOverhead ? kHostOverheadSweep : kDefaultSweep));
  apply_dtype(parsed.get("--dtype", "bf16"), command.spec);
  command.options.routing = parse_routing(parsed.get("--routing", "uniform"));
  command.options.orientation = parse_orientation(parsed.get("--orientation", "auto"));
  command.options.seed = parse_seed(parsed.get("--seed", "1"));
  command.spec.batch_invariant = parsed.flag("--batch-invariant");
  command.static_scales = parsed.flag("--static-scales");
  if (command.static_scales && command.spec.scheme != QuantScheme::kPerTensor)
    throw UsageError("--static-scales applies to --dtype fp8-tensor only");
  command.options.split_k = parse_split_k(parsed.get("--split-k", "auto"));
  command.options.fused_decode = parse_fused_decode(parsed.get("--fused-decode", "auto"));
  if (command.spec.batch_invariant && command.options.split_k > 1)
    throw UsageError("--batch-invariant layers never split K: --split-k must be auto or 1");
  if (command.spec.batch_invariant && command.options.orientation == Orientation::kSwapAB)
    throw UsageError("--batch-invariant runs the normal orientation: --orientation must be auto or normal");
  if (parsed.has("--variant")) parse_variant(parsed, command);
  command.cublas_peer = parse_peers(parsed.get("--peers", "none"));
  if (command.cublas_peer && command.spec.weight_dtype != WeightDType::kBF16)
    throw UsageError("--peers cublas times bf16 GEMMs: use --dtype bf16 (FP8 peers run from bench/peers.py)");
  if (parsed.has("--skip")) {
    command.options.skip_stages = parse_skip(parsed.get("--skip", ""));
    command.skip_text = parsed.get("--skip", "");
    if (command.mode != BenchMode::kSweep) throw UsageError("--skip applies to timed sweeps only");
    if (command.options.fused_decode == FusedDecode::kOn)
      throw UsageError("--skip runs the unfused kernels (stages to leave out): not with --fused-decode on");
    for (const char* option : {"--json", "--csv", "--peers"})
      if (parsed.has(option)) throw UsageError(std::string("--skip rows are not a valid layer: no ") + option);
    if (parsed.flag("--e2e")) throw UsageError("--skip rows are not a valid layer: no --e2e");
  }
  command.e2e = parsed.flag("--e2e");
  if (command.e2e && !command.moe_layers)
    throw UsageError("--e2e needs --model PRESET (the model's MoE layer count); --spec describes one layer");
  if (command.mode == BenchMode::kHostOverhead && parsed.has("--fused-decode"))
    throw UsageError("--host-overhead plans default runners: --fused-decode applies to sweeps and --explain "
                     "(HMOE_FUSED_DECODE=1/0 in the environment reaches every runner)");
  if (command.mode != BenchMode::kSweep) {
    for (const char* option : {"--json", "--csv", "--peers"})
      if (parsed.has(option)) throw UsageError(std::string(option) + " applies to timed sweeps, not --explain or --host-overhead");
    if (command.e2e) throw UsageError("--e2e applies to timed sweeps, not --explain or --host-overhead");
  }
  return command;
}

std::string command_line_of(const std::vector<std::string>& args) {
  std::string line = "hmoe bench";
  for (const std::string& arg : args) line += " " + arg;
  return line;
}

testkit::BenchReport new_report(const BenchCommand& command) {
  testkit::BenchReport report;
  report.command = command.command_line;
  report.device = testkit::describe(testkit::current_device_info());
  HMOE_CUDA_CHECK(cudaRuntimeGetVersion(&report.cuda_runtime_version));
  HMOE_CUDA_CHECK(cudaDriverGetVersion(&report.cuda_driver_version));
  report.date_utc = testkit::utc_now_iso8601();
  report.batch_invariant = command.spec.batch_invariant;
  return report;
}

testkit::ReportCeilings report_ceilings(const testkit::Ceilings& ceilings) {
  testkit::ReportCeilings result;
  result.copy_gb_per_s = ceilings.copy_gb_per_s;
  result.read_gb_per_s = ceilings.read_gb_per_s;
  result.bandwidth_gb_per_s = ceilings.bandwidth_gb_per_s();
  result.bf16_gemm_tflop_per_s = ceilings.bf16_gemm_tflop_per_s;
  return result;
}

void write_outputs(const BenchCommand& command, const testkit::BenchReport& report) {
  if (!command.json_path.empty()) testkit::write_text_file(command.json_path, testkit::to_json(report));
  if (!command.csv_path.empty()) testkit::write_text_file(command.csv_path, testkit::to_csv(report));
}

void print_header(const BenchCommand& command) {
  const MoeSpec& spec = command.spec;
  const testkit::Ceilings& ceilings = testkit::measured_ceilings();
  std::printf("command: %s\n", command.command_line.c_str());
  std::printf("build: %s\n", build_description().c_str());
  std::printf("device: %s\n", testkit::describe(testkit::current_device_info()).c_str());
  std::printf("ceilings: d2d copy %.0f GB/s (read+write), read-only stream %.0f GB/s -> floor uses %.0f GB/s; "
              "bf16 GEMM 8192^3 %.1f TFLOP/s\n",
              ceilings.copy_gb_per_s, ceilings.read_gb_per_s, ceilings.bandwidth_gb_per_s(),
              ceilings.bf16_gemm_tflop_per_s);
  if (spec.weight_dtype == WeightDType::kFP8E4M3) {
    try {
      std::printf("fp8 ceiling: e4m3 GEMM 8192^3 (cuBLASLt, per-tensor scales) %.1f TFLOP/s: the FP8 floor's matrix peak\n",
                  testkit::measured_fp8_gemm_tflop_per_s());
    } catch (const Error& error) {
      std::printf("fp8 ceiling: not measured (%s): the FP8 floor's matrix peak is 2 x the bf16 GEMM\n", error.what());
    }
  }
  std::printf("layer: %s %s E=%d k=%d H=%d I=%d %s; routing %s; orientation %s; batch-invariant %s; %d input sets; "
              "CUDA graph replays\n",
              command.layer_name.c_str(), layer_dtype(command).c_str(), spec.num_experts, spec.top_k, spec.hidden, spec.intermediate,
              to_string(spec.routing.function).c_str(), testkit::to_string(command.options.routing).c_str(),
              to_string(command.options.orientation).c_str(), spec.batch_invariant ? "on" : "off",
              command.options.input_sets);
  if (command.options.skip_stages != 0)
    std::printf("SKIPPED STAGES: %s -- NOT a valid layer: time attribution only (each input set ran once whole "
                "first; the skipped stages' outputs are that run's)\n",
                command.skip_text.c_str());
  if (command.cublas_peer)
    std::printf("peer cublas: per expert cublasGemmEx GEMM1 + one SwiGLU kernel + per expert GEMM2, same expert "
                "load, CUDA graph replays (GEMMs and activation only)\n");
  std::printf("%6s %11s %21s %8s %8s %9s %7s %8s", "T", "median_us", "p10-p90_us", "TFLOP/s", "GB/s", "floor_us",
              "%floor", "experts");
  if (command.cublas_peer) std::printf(" %10s %12s", "cublas_us", "hmoe/cublas");
  std::printf("  %s\n", "plan (orientation weight_tile x token_tile) [chosen by]");
  std::fflush(stdout);
}

testkit::ReportRow hmoe_report_row(const testkit::BenchRow& row, int requested_split_k) {
  testkit::ReportRow result;
  result.impl = "hmoe";
  result.num_tokens = row.num_tokens;
  result.replays = row.replays;
  result.median_us = row.median_us;
  result.p10_us = row.p10_us;
  result.p90_us = row.p90_us;
  result.tflop_per_s = row.tflop_per_s;
  result.gb_per_s = row.gb_per_s;
  result.floor_us = row.floor_us;
  result.percent_of_floor = row.percent_of_floor;
  result.experts_hit = row.experts_hit;
  result.variant = plan_summary(row.plan, requested_split_k);
  result.variant_source = row.plan.source;
  result.gemm1_kernel = row.plan.gemm1_kernel;
  result.gemm2_kernel = row.plan.gemm2_kernel;
  result.tokens_per_expert = row.tokens_per_expert;
  return result;
}

// A peer's row over the same work and floor as hmoe's row at the same T.
testkit::ReportRow peer_report_row(const testkit::PeerRow& peer, const testkit::ReportRow& hmoe) {
  testkit::ReportRow result;
  result.impl = peer.peer;
  result.num_tokens = peer.num_tokens;
  result.replays = peer.timing.replays;
  result.median_us = peer.timing.median_us;
  result.p10_us = peer.timing.p10_us;
  result.p90_us = peer.timing.p90_us;
  result.tflop_per_s = hmoe.tflop_per_s * hmoe.median_us / peer.timing.median_us;
  result.gb_per_s = hmoe.gb_per_s * hmoe.median_us / peer.timing.median_us;
  result.floor_us = hmoe.floor_us;
  result.percent_of_floor = 100.0 * hmoe.floor_us / peer.timing.median_us;
  result.experts_hit = hmoe.experts_hit;
  result.variant = std::to_string(peer.kernel_launches) + " calls (GEMMs + SwiGLU)";
  result.variant_source = "cublasGemmEx per expert";
  result.hmoe_over_peer = hmoe.median_us / peer.timing.median_us;
  return result;
}

void print_row(const testkit::ReportRow& row, const testkit::ReportRow* peer) {
  char spread[64];
  std::snprintf(spread, sizeof(spread), "%.1f-%.1f", row.p10_us, row.p90_us);
  std::printf("%6d %11.1f %21s %8.1f %8.0f %9.1f %6.0f%% %8.1f", row.num_tokens, row.median_us, spread,
              row.tflop_per_s, row.gb_per_s, row.floor_us, row.percent_of_floor, row.experts_hit);
  if (peer != nullptr) std::printf(" %10.1f %12.3f", peer->median_us, *peer->hmoe_over_peer);
  std::printf("  %s [%s]\n", row.variant.c_str(), row.variant_source.substr(0, row.variant_source.find(':')).c_str());
  std::fflush(stdout);
}

// --e2e: every MoE layer of the model at the measured per-layer medians (attention, norms and the
// dense layers are not part of it: this is the MoE share of TTFT and of one decode step).
void print_model_level(const BenchCommand& command, const testkit::BenchReport& report) {
  const int layers = *command.moe_layers;
  std::printf("\nmodel level: %s, %d MoE layers; MoE part of a forward pass = %d x one layer's median\n",
              command.layer_name.c_str(), layers, layers);
  std::printf("  prefill P: all P prompt tokens in one pass (MoE part of time to first token)\n"
              "  decode B:  one step for a batch of B sequences (MoE part of the time per output token)\n"
              "  speed-up = peer time / hmoe time - 1\n");
  std::printf("%-10s %6s %11s %11s", "phase", "tokens", "hmoe_ms", "floor_ms");
  if (command.cublas_peer) std::printf(" %11s %16s", "cublas_ms", "speed-up_vs_cublas");
  std::printf("\n");
  for (const testkit::ReportRow& row : report.rows) {
    if (row.impl != "hmoe") continue;
    const char* phase = row.num_tokens <= kLargestDecodeBatch ? "decode B" : "prefill P";
    std::printf("%-10s %6d %11.3f %11.3f", phase, row.num_tokens, layers * row.median_us * 1e-3,
                layers * row.floor_us * 1e-3);
    for (const testkit::ReportRow& peer : report.rows) {
      if (peer.impl == "hmoe" || peer.num_tokens != row.num_tokens) continue;
      std::printf(" %11.3f %+15.1f%%", layers * peer.median_us * 1e-3, 100.0 * (peer.median_us / row.median_us - 1.0));
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

int sweep(const BenchCommand& command) {
  print_header(command);
  testkit::BenchReport report = new_report(command);
  report.ceilings = report_ceilings(testkit::measured_ceilings());
  testkit::ReportLayer layer;
  layer.name = command.layer_name;
  layer.spec = command.spec;
  layer.dtype = layer_dtype(command);
  layer.routing = testkit::to_string(command.options.routing);
  layer.orientation = to_string(command.options.orientation);
  layer.input_sets = command.options.input_sets;
  layer.moe_layers = command.moe_layers;
  report.layer = layer;
  write_outputs(command, report);  // an unwritable --json/--csv path fails before any timing

  testkit::LayerWeights weights;
  {
    const testkit::Stream stream;
    weights = testkit::make_layer_weights(command.spec, command.options.seed, /*keep_host_copy=*/false, stream.get(),
                                          command.static_scales);
    stream.synchronize();
  }
  std::unique_ptr<testkit::CublasExpertLoop> cublas;
  if (command.cublas_peer) cublas = std::make_unique<testkit::CublasExpertLoop>(command.spec, command.options.seed);

  for (int num_tokens : command.options.token_counts) {
    testkit::BenchOptions options = command.options;
    options.token_counts = {num_tokens};
    const testkit::ReportRow row = hmoe_report_row(testkit::bench_layer(weights, options).front(), options.split_k);
    report.rows.push_back(row);
    std::optional<testkit::ReportRow> peer_row;
    if (cublas) {
      const testkit::PeerRow peer =
          cublas->bench(num_tokens, row.tokens_per_expert, options.seconds_per_point, options.min_replays);
      peer_row = peer_report_row(peer, row);
      report.rows.push_back(*peer_row);
    }
    print_row(row, peer_row ? &*peer_row : nullptr);
    write_outputs(command, report);
  }
  if (command.e2e) print_model_level(command, report);
  return 0;
}

// --ceilings: the card's limits alone. The fp8 GEMM is measured last and may fail on its own (a
// cuBLASLt without an e4m3 kernel for this card): the other ceilings are still printed and written.
int ceilings_only(const BenchCommand& command) {
  testkit::BenchReport report = new_report(command);
  const testkit::Ceilings& ceilings = testkit::measured_ceilings();
  report.ceilings = report_ceilings(ceilings);
  std::printf("command: %s\n", command.command_line.c_str());
  std::printf("build: %s\n", build_description().c_str());
  std::printf("device: %s\n", report.device.c_str());
  std::printf("cuda: runtime %d, driver supports %d\n", report.cuda_runtime_version, report.cuda_driver_version);
  std::printf("d2d copy (read+write bytes)   %8.0f GB/s\n", ceilings.copy_gb_per_s);
  std::printf("read-only stream              %8.0f GB/s\n", ceilings.read_gb_per_s);
  std::printf("bandwidth the floor uses      %8.0f GB/s\n", ceilings.bandwidth_gb_per_s());
  std::printf("bf16 GEMM 8192^3 (cuBLAS)     %8.1f TFLOP/s\n", ceilings.bf16_gemm_tflop_per_s);
  int status = 0;
  try {
    report.ceilings->fp8_gemm_tflop_per_s = testkit::measured_fp8_gemm_tflop_per_s();
    std::printf("fp8 e4m3 GEMM 8192^3 (cuBLASLt, per-tensor scales, fast accumulation) %8.1f TFLOP/s\n",
                *report.ceilings->fp8_gemm_tflop_per_s);
  } catch (const std::exception& error) {
    std::printf("fp8 e4m3 GEMM 8192^3: not measured: %s\n", error.what());
    std::cerr << "hmoe bench: error: fp8 GEMM ceiling: " << error.what() << "\n";
    status = kExitFailure;
  }
  std::fflush(stdout);
  write_outputs(command, report);
  return status;
}

// What GEMM1 does for GEMM2's FP8 input in the bench's runs (PlanInfo::fused_requant, gemm1_amax; an
// fp8-tensor plan names both, and the scales decide).
std::string requant_note(const BenchCommand& command, const PlanInfo& plan) {
  const bool tensor = command.spec.scheme == QuantScheme::kPerTensor;
  if (plan.fused_requant && (!tensor || command.static_scales)) return " +requant";
  if (plan.gemm1_amax && !command.static_scales) return " +amax";
  return "";
}

// --explain: the plan per T and who chose it, without running anything.
int explain(const BenchCommand& command) {
  std::string reason;
  const bool gpu = testkit::hopper_gpu_available(&reason);
  std::printf("layer: %s %s E=%d k=%d H=%d I=%d; orientation %s; batch-invariant %s\n", command.layer_name.c_str(),
              layer_dtype(command).c_str(),
              command.spec.num_experts, command.spec.top_k, command.spec.hidden, command.spec.intermediate,
              to_string(command.options.orientation).c_str(), command.spec.batch_invariant ? "on" : "off");
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
    plan_options.split_k = command.options.split_k;
    plan_options.fused_decode = command.options.fused_decode;
    plan_options.force_variant = command.options.force_variant;
    const PlanInfo plan = MoeRunner(command.spec, plan_options).plan_info(num_tokens);
    std::printf("%6d %12.2f  %-20s %-28s %-28s %s\n", num_tokens,
                static_cast<double>(num_tokens) * command.spec.top_k / command.spec.num_experts,
                (plan_summary(plan, command.options.split_k) + requant_note(command, plan)).c_str(),
                plan.gemm1_kernel.c_str(), plan.gemm2_kernel.c_str(), plan.source.c_str());
  }
  return 0;
}

// --host-overhead: CPU cost of enqueuing one layer, and its launch count.
void host_overhead(const BenchCommand& command) {
  std::printf("device: %s\n", testkit::describe(testkit::current_device_info()).c_str());
  std::printf("layer: %s %s; batch-invariant %s; CPU time per call (steady clock), %d calls each, stream "
              "synchronised every 32 calls outside the timed region\n",
              command.layer_name.c_str(), command.spec.weight_dtype == WeightDType::kFP8E4M3 ? to_string(command.spec.scheme).c_str() : "bf16",
              command.spec.batch_invariant ? "on" : "off", kHostOverheadCalls);
  const testkit::LaunchCosts costs = testkit::measure_launch_costs(kHostOverheadCalls);
  std::printf("floor on this host: %.2f us per empty kernel launch, %.2f us per TMA descriptor encode (4 per "
              "layer)\n", costs.empty_launch_us, costs.tensor_map_encode_us);
  std::printf("%6s %16s %13s %18s %18s %9s %6s  %s\n", "T", "run_median_us", "run_p90_us", "replay_run_us",
              "graph_launch_us", "kernels", "nodes", "plan");
  testkit::LayerWeights weights;
  {
    const testkit::Stream stream;
    weights = testkit::make_layer_weights(command.spec, command.options.seed, false, stream.get(), command.static_scales);
    stream.synchronize();
  }
  for (int num_tokens : command.options.token_counts) {
    const testkit::HostOverhead row = testkit::measure_host_overhead(weights, num_tokens, kHostOverheadCalls);
    PlanOptions plan_options;
    plan_options.max_tokens = num_tokens;
    std::printf("%6d %16.2f %13.2f %18.2f %18.2f %9d %6d  %s\n", row.num_tokens, row.run_median_us, row.run_p90_us,
                row.replay_run_median_us, row.graph_launch_median_us, row.kernel_launches, row.graph_nodes,
                plan_summary(MoeRunner(command.spec, plan_options).plan_info(num_tokens)).c_str());
    std::fflush(stdout);
  }
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  BenchCommand command;
  try {
    const ParsedOptions parsed = parse_options(
        args,
        {"--model", "--spec", "--tokens", "--dtype", "--routing", "--orientation", "--seed", "--peers", "--json",
         "--csv", "--skip", "--split-k", "--fused-decode", "--variant"},
        {"--explain", "--host-overhead", "--ceilings", "--batch-invariant", "--e2e", "--static-scales"});
    if (parsed.help) {
      std::cout << kBenchUsage;
      return 0;
    }
    command = parse_bench(parsed);
    command.command_line = command_line_of(args);
  } catch (const UsageError& error) {
    return usage_error("bench", error.what(), kBenchUsage);
  }
  if (command.mode == BenchMode::kExplain) return explain(command);
  if (report_if_no_hopper_gpu("bench")) return kExitFailure;

  try {
    switch (command.mode) {
      case BenchMode::kCeilings: return ceilings_only(command);
      case BenchMode::kHostOverhead: host_overhead(command); return 0;
      default: return sweep(command);
    }
  } catch (const std::exception& error) {
    std::cerr << "hmoe bench: error: " << error.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace hmoe::cli
