// `hmoe trace`: one layer run with the expert GEMMs recording when each work item started, had its
// first stage, finished its mainloop and its epilogue, and when the producer issued each stage; per
// GEMM launch, where an item's time goes (testkit/gemm_trace.hpp). Needs a build configured with
// -DHMOE_GEMM_TRACE=ON (the default build's kernels hold none of it).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "common/cuda_check.hpp"
#include "gemm/trace.hpp"
#include "testkit/bench_report.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/device.hpp"
#include "testkit/gemm_trace.hpp"
#include "testkit/layer_data.hpp"

namespace hmoe::cli {
namespace {

namespace trace = gemm::trace;

constexpr int kDefaultRecords = 8192;
constexpr int kMostRecords = 1 << 20;

constexpr const char* kTraceUsage =
    "usage: hmoe trace --model PRESET --tokens T [--dtype DTYPE] [--variant GEMM1+GEMM2] [--records N]\n"
    "                  [--csv FILE]\n"
    "  --model    a preset of DESIGN.md §3 (hmoe info lists them)\n"
    "  --tokens   the token count of the traced run\n"
    "  --variant  plan with this kernel pair (as hmoe bench --variant); default: hmoe's choice\n"
    "  --records  records each recording thread keeps at most (default 8192; later ones are counted)\n"
    "  --csv      also write every record to FILE (launch,variant,cta,role,item,k_block,event,sm,clock)\n"
    "runs the layer twice untimed, then once with the expert GEMMs recording their work items (the\n"
    "producer's stage issues; each consumer warpgroup's item start, first stage landed, mainloop end,\n"
    "epilogue end; SM clock cycles), and prints per GEMM launch the mean split of an item's time and\n"
    "whether the producer was ahead of the consumers. The fused decode layer is off (it has no GEMM\n"
    "launches). Needs a build configured with -DHMOE_GEMM_TRACE=ON (e.g. cmake -S . -B build-trace\n"
    "-DHMOE_GEMM_TRACE=ON); the recording shifts the timings a little. Exit 1 if this build has no\n"
    "timeline or no Hopper GPU, 2 on bad usage\n";

}  // namespace

int run_trace(const std::vector<std::string>& args) {
  std::string preset_name;
  MoeSpec spec;
  int num_tokens = 0;
  std::string variant;
  std::string csv_path;
  int records_per_role = kDefaultRecords;
  try {
    const ParsedOptions parsed = parse_options(args, {"--model", "--dtype", "--tokens", "--variant", "--records", "--csv"});
    if (parsed.help) {
      std::cout << kTraceUsage << kDtypeHelp;
      return 0;
    }
    if (!parsed.has("--model")) throw UsageError("missing --model PRESET");
    if (!parsed.has("--tokens")) throw UsageError("missing --tokens T");
    preset_name = parsed.get("--model", "");
    spec = parse_preset(preset_name);
    apply_dtype(parsed.get("--dtype", "bf16"), spec);
    num_tokens = parse_positive_int("--tokens", parsed.get("--tokens", ""));
    variant = parsed.get("--variant", "");
    records_per_role = parse_count("--records", parsed.get("--records", std::to_string(kDefaultRecords)), kMostRecords);
    csv_path = parsed.get("--csv", "");
  } catch (const UsageError& error) {
    return usage_error("trace", error.what(), kTraceUsage);
  }
  if (!trace::kCompiled) {
    std::cerr << "hmoe trace: this build's GEMM kernels record no timeline; configure a build with "
                 "-DHMOE_GEMM_TRACE=ON (cmake -S . -B build-trace -DHMOE_GEMM_TRACE=ON) and run its hmoe\n";
    return kExitFailure;
  }
  if (report_if_no_hopper_gpu("trace")) return kExitFailure;

  try {
    const testkit::DeviceInfo device = testkit::current_device_info();
    const testkit::Stream stream;
    const testkit::LayerWeights weights = testkit::make_layer_weights(spec, 1, false, stream.get());
    PlanOptions options{num_tokens};
    options.force_variant = variant;
    options.fused_decode = FusedDecode::kOff;
    const MoeRunner runner(spec, options);
    testkit::DeviceBuffer workspace(runner.workspace_bytes());
    testkit::DeviceBuffer out(static_cast<std::size_t>(num_tokens) * spec.hidden * 2);
    const testkit::LayerInputs inputs =
        testkit::make_layer_inputs(weights, num_tokens, testkit::Entry::kLogits, testkit::RoutingDraw{}, stream.get());
    RunArgs run_args = testkit::run_args(weights, inputs, out.get());
    run_args.workspace = workspace.get();
    run_args.workspace_size = workspace.bytes();
    for (int run = 0; run < 2; ++run) testkit::run_layer(runner, run_args, inputs, stream.get());
    stream.synchronize();

    const std::vector<testkit::LaunchRecords> recorded = testkit::record_gemm_timeline(
        [&] { testkit::run_layer(runner, run_args, inputs, stream.get()); }, stream.get(), records_per_role);
    std::vector<testkit::LaunchSummary> summaries;
    for (const testkit::LaunchRecords& launch : recorded) summaries.push_back(testkit::summarize(launch));
    int clock_khz = 0;
    int device_index = 0;
    HMOE_CUDA_CHECK(cudaGetDevice(&device_index));
    HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device_index));
    const PlanInfo plan = runner.plan_info(num_tokens);
    std::printf("%s, %s T=%d %s, plan %s [%s]; %zu GEMM launches recorded\n", testkit::describe(device).c_str(),
                preset_name.c_str(), num_tokens, dtype_name(spec).c_str(), plan_summary(plan).c_str(),
                plan.source.c_str(), recorded.size());
    std::printf("%s", testkit::format_summaries(summaries, clock_khz).c_str());
    if (!csv_path.empty()) testkit::write_text_file(csv_path, testkit::records_csv(recorded));
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "hmoe trace: " << error.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace hmoe::cli
