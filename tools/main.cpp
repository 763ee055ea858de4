// `hmoe`: inspect the device and kernels (info), check layers against the CPU reference (check),
// time them against the hardware floor (bench), tune the variant choice (tune), time start-up (coldstart),
// quantise bf16 weights to FP8 (quantize), record the expert GEMMs' work-item timeline (trace).
#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"

namespace {

constexpr const char* kUsage =
    "usage: hmoe <command> [options]\n"
    "commands:\n"
    "  info       device, presets and the kernels each plan uses\n"
    "  check      run layers and compare them with the float64 CPU reference\n"
    "  bench      time layers as CUDA-graph replays against the measured hardware floor\n"
    "  tune       time every eligible kernel variant per token count; write the tuned table\n"
    "  coldstart  time from process start to the first output, and first-call vs steady latency\n"
    "  quantize   bf16 expert weights (raw file) -> e4m3 values and scales in a checkpoint FP8 layout\n"
    "  trace      where an expert-GEMM work item's time goes (a build with -DHMOE_GEMM_TRACE=ON)\n"
    "run 'hmoe <command> --help' for the options of a command\n";

}  // namespace

int main(int argc, char** argv) {
  hmoe::cli::record_main_entry();
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << "hmoe: missing command\n" << kUsage;
    return hmoe::cli::kExitUsage;
  }
  const std::string& command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  if (command == "info") return hmoe::cli::run_info(rest);
  if (command == "check") return hmoe::cli::run_check(rest);
  if (command == "bench") return hmoe::cli::run_bench(rest);
  if (command == "tune") return hmoe::cli::run_tune(rest);
  if (command == "coldstart") return hmoe::cli::run_coldstart(rest);
  if (command == "quantize") return hmoe::cli::run_quantize(rest);
  if (command == "trace") return hmoe::cli::run_trace(rest);
  std::cerr << "hmoe: unknown command '" << command << "'\n" << kUsage;
  return hmoe::cli::kExitUsage;
}
