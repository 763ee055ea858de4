// `hmoe info`: what this build can run and where — the version, the device, the presets, the compiled
// GEMM kernel variants, and the kernels the runner's plan picks for a few token counts.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "testkit/device.hpp"

namespace hmoe::cli {
namespace {

constexpr const char* kInfoUsage =
    "usage: hmoe info\n"
    "prints the hmoe version, the device (or why there is no usable Hopper GPU), the presets of\n"
    "DESIGN.md §3, every compiled GEMM kernel variant, and the kernels MoeRunner plans for a decode,\n"
    "a mid and a prefill token count of each preset\n";

// Decode, the Swap-AB/normal crossover region, and prefill.
constexpr int kPlannedTokenCounts[] = {1, 64, 4096};

void print_device() {
  std::string reason;
  if (testkit::hopper_gpu_available(&reason)) {
    std::printf("device: %s\n", testkit::describe(testkit::current_device_info()).c_str());
  } else {
    std::printf("device: no Hopper GPU: %s\n", reason.c_str());
  }
}

void print_presets() {
  std::printf("presets:\n  %-22s %5s %3s %6s %6s  %s\n", "name", "E", "k", "H", "I", "routing");
  for (const std::string& name : preset_names()) {
    const MoeSpec spec = preset(name);
    std::printf("  %-22s %5d %3d %6d %6d  %s%s\n", name.c_str(), spec.num_experts, spec.top_k, spec.hidden,
                spec.intermediate, to_string(spec.routing.function).c_str(),
                spec.routing.function == RoutingFunction::kSoftmaxTopK && !spec.routing.renormalize
                    ? " (no renormalise)"
                    : "");
  }
}

void print_compiled_kernels() {
  const std::vector<std::string> kernels = compiled_kernels();
  std::printf("compiled kernels (%zu):\n", kernels.size());
  for (const std::string& kernel : kernels) std::printf("  %s\n", kernel.c_str());
}

void print_plans() {
  std::printf("kernel plans (orientation auto):\n");
  for (const std::string& name : preset_names()) {
    for (int num_tokens : kPlannedTokenCounts) {
      try {
        PlanOptions options;
        options.max_tokens = num_tokens;
        const MoeRunner runner(preset(name), options);
        const PlanInfo plan = runner.plan_info(num_tokens);
        std::printf("  %-22s T=%-5d %-12s gemm1=%s gemm2=%s\n", name.c_str(), num_tokens,
                    plan_summary(plan).c_str(), plan.gemm1_kernel.c_str(), plan.gemm2_kernel.c_str());
      } catch (const std::exception& error) {
        std::printf("  %-22s T=%-5d plan unavailable: %s\n", name.c_str(), num_tokens, error.what());
      }
    }
  }
}

}  // namespace

int run_info(const std::vector<std::string>& args) {
  try {
    const ParsedOptions parsed = parse_options(args, {});
    if (parsed.help) {
      std::cout << kInfoUsage;
      return 0;
    }
  } catch (const UsageError& error) {
    return usage_error("info", error.what(), kInfoUsage);
  }
  std::printf("hmoe %s\n", version().c_str());
  print_device();
  print_presets();
  print_compiled_kernels();
  print_plans();
  return 0;
}

}  // namespace hmoe::cli
