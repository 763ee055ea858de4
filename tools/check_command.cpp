// `hmoe check`: runs one preset at each requested token count and judges it against the float64
// CPU reference (DESIGN.md §2); exits 0 only when every line passes.
#include <cstdio>
#include <exception>
#include <iostream>

#include "cli.hpp"
#include "testkit/check.hpp"
#include "testkit/cuda_handles.hpp"

namespace hmoe::cli {
namespace {

constexpr const char* kCheckUsage =
    "usage: hmoe check --model PRESET [--tokens T[,T...]] [--dtype DTYPE] [--routing uniform|zipf|extreme]\n"
    "                  [--entry logits|topk] [--orientation auto|normal|swap] [--seed N] [--ref-tokens N]\n"
    "                  [--static-scales] [--ue8m0] [--split-k auto|N] [--fused-decode auto|on|off]\n"
    "  --model        a preset of DESIGN.md §3 (hmoe info lists them)\n"
    "  --tokens       token counts to check, comma separated (default 1,7,64,1000)\n"
    "  --dtype        bf16 (default), fp8-tensor, fp8-channel or fp8-block (see hmoe bench --help)\n"
    "  --routing      expert load: uniform random, zipf popularity, or extreme (all to the same k)\n"
    "  --entry        run_from_logits (default) or run_from_topk with generated ids and weights\n"
    "  --orientation  GEMM orientation the runner is planned with (default auto)\n"
    "  --seed         seed of weights and inputs (default 1)\n"
    "  --ref-tokens   above this many tokens the reference checks a random sample of this many plus the\n"
    "                 first and last token (default 256); unwritten outputs are counted over all tokens\n"
    "  --static-scales  fp8-tensor: static activation scales (vLLM a1_scale/a2_scale) instead of dynamic\n"
    "  --ue8m0        FP8: power-of-two (UE8M0) scales for weights and activations\n"
    "  --split-k      ways the Swap-AB GEMMs split K over CTAs: auto (default, hmoe's rule at decode\n"
    "                 sizes), 1 (never) or at most N (wherever a Swap-AB variant runs, capped by K and the\n"
    "                 split workspace; plan= says \"(asked N)\" when a GEMM split fewer ways)\n"
    "  --fused-decode the whole layer as one kernel at T <= 4: auto (default: where this device's tuned\n"
    "                 table says so), on (wherever it applies) or off (PlanOptions::fused_decode)\n"
    "FP8 lines also give the error vs the unquantised bf16 layer (rel_err_bf16), for information\n"
    "prints one line per token count; exit 0 iff all pass, 1 if any fails or no Hopper GPU, 2 on bad usage\n";

struct CheckCommand {
  std::string preset_name;
  MoeSpec spec;
  std::vector<int> token_counts;
  testkit::CheckOptions options;
};

CheckCommand parse_check(const ParsedOptions& parsed) {
  if (!parsed.has("--model")) throw UsageError("missing --model PRESET");
  CheckCommand command;
  command.preset_name = parsed.get("--model", "");
  command.spec = parse_preset(command.preset_name);
  command.token_counts = parse_token_list(parsed.get("--tokens", "1,7,64,1000"));
  apply_dtype(parsed.get("--dtype", "bf16"), command.spec);
  if (parsed.flag("--ue8m0")) {
    if (command.spec.weight_dtype != WeightDType::kFP8E4M3) throw UsageError("--ue8m0 applies to FP8 dtypes only");
    command.spec.ue8m0_scales = true;
  }
  command.options.static_act_scales = parsed.flag("--static-scales");
  if (command.options.static_act_scales && command.spec.scheme != QuantScheme::kPerTensor)
    throw UsageError("--static-scales applies to --dtype fp8-tensor only");
  command.options.routing = parse_routing(parsed.get("--routing", "uniform"));
  command.options.entry = parse_entry_option(parsed.get("--entry", "logits"));
  command.options.orientation = parse_orientation(parsed.get("--orientation", "auto"));
  command.options.seed = parse_seed(parsed.get("--seed", "1"));
  command.options.max_reference_tokens = parse_positive_int("--ref-tokens", parsed.get("--ref-tokens", "256"));
  command.options.split_k = parse_split_k(parsed.get("--split-k", "auto"));
  command.options.fused_decode = parse_fused_decode(parsed.get("--fused-decode", "auto"));
  return command;
}

std::string check_line(const CheckCommand& command, int num_tokens, const testkit::CheckResult& result) {
  char rel_error[32];
  std::snprintf(rel_error, sizeof(rel_error), "%.3e", result.rel_error);
  char reference_seconds[32];
  std::snprintf(reference_seconds, sizeof(reference_seconds), "%.2fs", result.reference_seconds);
  std::string dtype = command.spec.scheme == QuantScheme::kNone ? "bf16" : to_string(command.spec.scheme);
  if (command.options.static_act_scales) dtype += "(static)";
  if (command.spec.ue8m0_scales) dtype += "(ue8m0)";
  char unquantised[48] = "";
  if (result.rel_error_unquantised >= 0.0)
    std::snprintf(unquantised, sizeof(unquantised), " rel_err_bf16=%.3e", result.rel_error_unquantised);
  return command.preset_name + " dtype=" + dtype + " T=" + std::to_string(num_tokens) +
         " routing=" + testkit::to_string(command.options.routing) +
         " entry=" + testkit::to_string(command.options.entry) +
         " orientation=" + to_string(command.options.orientation) +
         " plan=" + plan_summary(result.plan, command.options.split_k) +
         " rel_err=" + rel_error + unquantised + " checked=" + std::to_string(result.tokens_checked) + "/" +
         std::to_string(result.num_tokens) + (result.sampled ? "(sampled)" : "") +
         " unwritten=" + std::to_string(result.unwritten) + " nonfinite=" + std::to_string(result.nonfinite) +
         " ref=" + reference_seconds + (result.passed ? " PASS" : " FAIL");
}

}  // namespace

int run_check(const std::vector<std::string>& args) {
  CheckCommand command;
  try {
    const ParsedOptions parsed = parse_options(
        args, {"--model", "--tokens", "--dtype", "--routing", "--entry", "--orientation", "--seed", "--ref-tokens",
               "--split-k", "--fused-decode"},
        {"--static-scales", "--ue8m0"});
    if (parsed.help) {
      std::cout << kCheckUsage;
      return 0;
    }
    command = parse_check(parsed);
  } catch (const UsageError& error) {
    return usage_error("check", error.what(), kCheckUsage);
  }
  if (report_if_no_hopper_gpu("check")) return kExitFailure;

  try {
    testkit::Stream stream;
    const testkit::LayerWeights weights =
        testkit::make_layer_weights(command.spec, command.options.seed, /*keep_host_copy=*/true, stream.get(),
                                    command.options.static_act_scales);
    bool all_passed = true;
    for (int num_tokens : command.token_counts) {
      testkit::CheckOptions options = command.options;
      options.num_tokens = num_tokens;
      const testkit::CheckResult result = testkit::check_layer(weights, options);
      std::cout << check_line(command, num_tokens, result) << std::endl;
      all_passed = all_passed && result.passed;
    }
    return all_passed ? 0 : kExitFailure;
  } catch (const std::exception& error) {
    std::cerr << "hmoe check: error: " << error.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace hmoe::cli
