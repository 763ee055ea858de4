// `hmoe info`: what this build can run and where — the device, the presets, and the kernels the
// runner's plan picks for a few token counts.
#include <cstdio>
#include <exception>
#include <iostream>

#include "cli.hpp"
#include "testkit/device.hpp"

namespace hmoe::cli {
namespace {

constexpr const char* kInfoUsage =
    "usage: hmoe info\n"
    "prints the device (or why there is no usable Hopper GPU), the presets of DESIGN.md §3, and the\n"
    "GEMM kernels MoeRunner plans for a decode, a mid and a prefill token count of each preset\n";

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
  // NOTE: the library exposes no version yet; the CMake project version is not compiled in.
  std::printf("hmoe: version not exposed by the library\n");
  print_device();
  print_presets();
  print_plans();
  return 0;
}

}  // namespace hmoe::cli
