// `hmoe info`: what this build can run and where — the version, the device, the presets, the compiled
// GEMM kernel variants, and the kernels the runner's plan picks for a few token counts.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "dispatch/registry.hpp"
#include "testkit/device.hpp"

namespace hmoe::cli {
namespace {

constexpr const char* kInfoUsage =
    "usage: hmoe info [--kernels]\n"
    "prints the hmoe version, the device (or why there is no usable Hopper GPU), the presets of\n"
    "DESIGN.md §3, every compiled GEMM kernel variant, and the kernels MoeRunner plans for a decode,\n"
    "a mid and a prefill token count of each preset (with who chose them: analytic rule or tuned table)\n"
    "  --kernels  only the kernel registry: every compiled variant with its constraints, one per line\n"
    "             (all compiled ahead of time for sm_90a; nothing is compiled at run time)\n";

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

// One line per compiled variant: name, then its constraints as the dispatcher reads them.
void print_kernel_registry() {
  const auto variants = gemm::gemm_variants();
  std::printf("compiled kernels (%zu), all ahead of time for sm_90a (no JIT at run time):\n", variants.size());
  int name_width = 4;   // the columns line up under the longest name
  for (const gemm::GemmVariant& variant : variants)
    name_width = std::max(name_width, static_cast<int>(std::strlen(variant.name)));
  std::printf("  %-*s %-15s %-6s %6s %6s %6s %8s %s\n", name_width, "name", "epilogue", "orient", "tokens", "weight",
              "stages", "dtype", "needs");
  for (const gemm::GemmVariant& variant : variants) {
    const dispatch::GemmConstraints constraints = dispatch::constraints_of(variant);
    std::printf("  %-*s %-15s %-6s %6d %6d %6d %8s H,I %% %d == 0\n", name_width, variant.name,
                variant.epilogue == gemm::EpilogueKind::kSwiGlu ? "gemm1-swiglu" : "gemm2-weighted",
                dispatch::orientation_name(variant), variant.token_tile, variant.weight_tile, variant.stages,
                to_string(constraints.dtype).c_str(), constraints.dim_alignment);
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
        std::printf("  %-22s T=%-5d %-12s gemm1=%s gemm2=%s (%s)\n", name.c_str(), num_tokens,
                    plan_summary(plan).c_str(), plan.gemm1_kernel.c_str(), plan.gemm2_kernel.c_str(),
                    plan.source.c_str());
      } catch (const std::exception& error) {
        std::printf("  %-22s T=%-5d plan unavailable: %s\n", name.c_str(), num_tokens, error.what());
      }
    }
  }
}

}  // namespace

int run_info(const std::vector<std::string>& args) {
  bool kernels_only = false;
  try {
    const ParsedOptions parsed = parse_options(args, {}, {"--kernels"});
    if (parsed.help) {
      std::cout << kInfoUsage;
      return 0;
    }
    kernels_only = parsed.flag("--kernels");
  } catch (const UsageError& error) {
    return usage_error("info", error.what(), kInfoUsage);
  }
  if (kernels_only) {
    print_kernel_registry();
    return 0;
  }
  std::printf("%s\n", build_description().c_str());
  print_device();
  print_presets();
  print_compiled_kernels();
  print_plans();
  return 0;
}

}  // namespace hmoe::cli
