// `hmoe coldstart`: how long a fresh process takes to its first layer output (weights already on the
// GPU: their generation is timed and excluded), and how each token count's first call compares with
// its steady state — the start-up cost JIT-compiling peers pay in seconds.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/device.hpp"
#include "testkit/l2_reset.hpp"
#include "testkit/launch_gate.hpp"
#include "testkit/layer_data.hpp"

namespace hmoe::cli {
namespace {

// The acceptance token counts: odd sizes no tuned bucket matches exactly.
constexpr const char* kDefaultTokens = "1,3,17,100,777,5000,12345";
constexpr int kSteadyWarmup = 10;
constexpr int kSteadyRuns = 50;
constexpr int kIsolatedRuns = 20;
// Input sets per T: the first call runs set 0; the steady state cycles through all of them, each
// routing to other experts, so no steady call finds its weights in L2 from the call before
// (DESIGN.md §4: rotate when the weights touched fit in L2; at T = 1 they do, 38–75 MB on qwen3).
constexpr int kInputSets = 5;
constexpr double kColdStartBudgetMs = 1000.0;
constexpr double kFirstCallBudget = 1.2;   // first call ≤ 1.2 × the steady-state median measured the same way

constexpr int kMaxProcesses = 32;

constexpr const char* kColdstartUsage =
    "usage: hmoe coldstart --model PRESET [--dtype D] [--tokens T[,T...]] [--no-warm-up] [--gate]\n"
    "                      [--processes N]\n"
    "  --model       a preset of DESIGN.md §3\n"
    "  --tokens      token counts (default 1,3,17,100,777,5000,12345); the first is the cold-start call\n"
    "  --no-warm-up  plan with PlanOptions::warm_up off (to measure what the plan-time warm-up buys)\n"
    "  --gate        time GPU work only: every timed call (first and steady) is enqueued behind a kernel\n"
    "                that holds the stream until the enqueue is done, so neither launch latency nor the\n"
    "                host's cost of the call is in its interval (first_host_us still has them)\n"
    "  --processes   run the measurement in N fresh processes one after another (1..32, default 1) and\n"
    "                print, per T, the median and the worst first-call ratio over them: the ratio of one\n"
    "                process moves by about 0.1 from one process to the next (H200)\n"
    "run it in a fresh process: prints the time from process start (a steady clock read first thing in\n"
    "main(), and the kernel's process start time from /proc/self/stat) to the first layer output,\n"
    "excluding weight and input generation, then per T the first call against the steady state. The\n"
    "first call is timed alone: the GPU idle before it, CUDA events around its enqueue, so its host\n"
    "launches are in it (not with --gate), and an L2 reset before it (a read pass over twice the L2\n"
    "size, synchronised).\n"
    "It is compared with two medians of 20 later calls timed the same way: reset_us, each after the\n"
    "same L2 reset (same cache contents as the first call: what the ratio shows above 1 is work done\n"
    "once), and isolated_us, with whatever the call before left in L2 (the layer's code, descriptors,\n"
    "routing tables and inputs: that ratio adds what a warm L2 saves). Each gets a verdict. The median\n"
    "of 50 back-to-back calls, whose launches overlap the previous call's kernels, is printed too\n"
    "(pipelined_us), and the host time spent inside run_from_logits by the first call (enqueue_1st) and\n"
    "by the reset_us calls (enqueue, median). Steady calls cycle through 5 input sets routed to\n"
    "different experts, so their weights are not left in L2 by the call before (the first call runs\n"
    "set 0). Exit 1 if no Hopper GPU, 2 on bad usage\n";

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point start, Clock::time_point stop) {
  return std::chrono::duration<double, std::milli>(stop - start).count();
}

// Milliseconds from the kernel starting this process to now, from /proc (10 ms ticks); < 0 if unknown.
double process_age_ms() {
  std::ifstream stat_file("/proc/self/stat");
  std::ifstream uptime_file("/proc/uptime");
  std::string stat;
  std::getline(stat_file, stat);
  double uptime_s = 0.0;
  uptime_file >> uptime_s;
  // NOTE: field 2 (the command name) may hold spaces; fields are counted after its closing ')'.
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos || !uptime_file) return -1.0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int index = 3; index <= 22 && fields >> field; ++index) {
    if (index == 22) return (uptime_s - std::stod(field) / static_cast<double>(::sysconf(_SC_CLK_TCK))) * 1e3;
  }
  return -1.0;
}

struct FirstCall {
  int num_tokens = 0;
  double first_us = 0.0;        // events around the first enqueue (GPU idle before it)
  double first_host_us = 0.0;   // steady clock around the first enqueue and its synchronisation
  double first_enqueue_us = 0.0;   // steady clock around the first run_from_logits alone (host work)
  double enqueue_us = 0.0;         // the same, median of the calls of reset_us
  double isolated_us = 0.0;     // median of kIsolatedRuns later calls, each timed as the first one
  double reset_us = 0.0;        // the same, each after the L2 reset the first call had before it
  double pipelined_us = 0.0;    // median of kSteadyRuns back-to-back calls
  PlanInfo plan;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

const char* verdict(double ratio) { return ratio <= kFirstCallBudget ? "PASS" : "FAIL"; }

// The largest first-call ratio seen and its T.
struct Worst {
  double ratio = 0.0;
  int num_tokens = 0;
  void add(double value, int tokens) {
    if (value > ratio) {
      ratio = value;
      num_tokens = tokens;
    }
  }
};

std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// --processes N: runs `hmoe coldstart` with the other arguments in N fresh processes in turn, echoes
// each one's summary line, and folds their per-T lines (`coldstart_t:`) into the median and the
// worst ratio per T. The parent creates no CUDA context.
int run_in_processes(const std::vector<std::string>& args, int processes) {
  char executable[PATH_MAX] = {};
  const ssize_t length = ::readlink("/proc/self/exe", executable, sizeof(executable) - 1);
  if (length <= 0) {
    std::cerr << "hmoe coldstart: cannot find this executable (/proc/self/exe) to start fresh processes\n";
    return kExitFailure;
  }
  std::string command = shell_quoted(executable) + " coldstart";
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--processes") {
      ++i;   // and its value
      continue;
    }
    if (args[i].rfind("--processes=", 0) == 0) continue;
    command += " " + shell_quoted(args[i]);
  }
  command += " 2>&1";
  std::map<int, std::vector<double>> ratios, warm_ratios;   // T → one ratio per process
  std::map<int, std::vector<double>> first_enqueues, enqueues;   // T → host µs per process
  std::vector<double> cold_ms;
  for (int process = 1; process <= processes; ++process) {
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) {
      std::cerr << "hmoe coldstart: could not start process " << process << "\n";
      return kExitFailure;
    }
    std::string output;
    char buffer[4096];
    while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
    const int status = ::pclose(pipe);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::cerr << "hmoe coldstart: process " << process << " failed; its output:\n" << output;
      return kExitFailure;
    }
    std::istringstream lines(output);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("coldstart:", 0) == 0) {
        std::printf("process %d: %s\n", process, line.c_str());
        const std::size_t at = line.find("cold_ms=");
        if (at != std::string::npos) cold_ms.push_back(std::stod(line.substr(at + 8)));
      }
      int num_tokens = 0;
      double first_us = 0.0, reset_us = 0.0, ratio = 0.0, isolated_us = 0.0, warm_ratio = 0.0;
      double first_enqueue_us = 0.0, enqueue_us = 0.0;
      if (std::sscanf(line.c_str(),
                      "coldstart_t: T=%d first_us=%lf reset_us=%lf ratio=%lf isolated_us=%lf warm_ratio=%lf "
                      "first_enqueue_us=%lf enqueue_us=%lf",
                      &num_tokens, &first_us, &reset_us, &ratio, &isolated_us, &warm_ratio, &first_enqueue_us,
                      &enqueue_us) == 8) {
        ratios[num_tokens].push_back(ratio);
        warm_ratios[num_tokens].push_back(warm_ratio);
        first_enqueues[num_tokens].push_back(first_enqueue_us);
        enqueues[num_tokens].push_back(enqueue_us);
      }
    }
  }
  std::printf("%6s %13s %12s  %-5s %18s %17s %12s %12s  %s\n", "T", "median_ratio", "worst_ratio", "",
              "median_warm_ratio", "worst_warm_ratio", "enqueue_1st", "enqueue",
              "(first call / steady after the same L2 reset, / steady with a warm L2; host us in run, medians)");
  Worst worst, worst_warm;
  for (const auto& [num_tokens, values] : ratios) {
    const double highest = *std::max_element(values.begin(), values.end());
    const std::vector<double>& warm = warm_ratios[num_tokens];
    const double highest_warm = *std::max_element(warm.begin(), warm.end());
    std::printf("%6d %12.2fx %11.2fx  %-5s %17.2fx %16.2fx %12.1f %12.1f  %s\n", num_tokens, median(values), highest,
                verdict(highest), median(warm), highest_warm, median(first_enqueues[num_tokens]),
                median(enqueues[num_tokens]), verdict(highest_warm));
    worst.add(highest, num_tokens);
    worst_warm.add(highest_warm, num_tokens);
  }
  if (ratios.empty()) {
    std::cerr << "hmoe coldstart: the processes printed no per-T lines\n";
    return kExitFailure;
  }
  std::printf("coldstart_processes: processes=%d worst_first_call_ratio=%.2f worst_T=%d worst_warm_ratio=%.2f "
              "worst_warm_T=%d max_cold_ms=%.1f\n",
              processes, worst.ratio, worst.num_tokens, worst_warm.ratio, worst_warm.num_tokens,
              cold_ms.empty() ? 0.0 : *std::max_element(cold_ms.begin(), cold_ms.end()));
  return 0;
}

}  // namespace

int run_coldstart(const std::vector<std::string>& args) {
  std::string preset_name;
  MoeSpec spec;
  std::vector<int> token_counts;
  bool warm_up = true;
  bool gated = false;
  int processes = 1;
  try {
    const ParsedOptions parsed =
        parse_options(args, {"--model", "--dtype", "--tokens", "--processes"}, {"--no-warm-up", "--gate"});
    if (parsed.help) {
      std::cout << kColdstartUsage << kDtypeHelp;
      return 0;
    }
    if (!parsed.has("--model")) throw UsageError("missing --model PRESET");
    preset_name = parsed.get("--model", "");
    spec = parse_preset(preset_name);
    apply_dtype(parsed.get("--dtype", "bf16"), spec);
    token_counts = parse_token_list(parsed.get("--tokens", kDefaultTokens));
    warm_up = !parsed.flag("--no-warm-up");
    gated = parsed.flag("--gate");
    processes = parse_count("--processes", parsed.get("--processes", "1"), kMaxProcesses);
  } catch (const UsageError& error) {
    return usage_error("coldstart", error.what(), kColdstartUsage);
  }
  const Clock::time_point entry = main_entry_time();
  const double age_at_entry_ms = process_age_ms() - ms_between(entry, Clock::now());
  if (report_if_no_hopper_gpu("coldstart")) return kExitFailure;
  if (processes > 1) return run_in_processes(args, processes);

  try {
    HMOE_CUDA_CHECK(cudaFree(nullptr));  // the context
    const Clock::time_point context_ready = Clock::now();
    const testkit::Stream stream;
    testkit::LayerWeights weights = testkit::make_layer_weights(spec, 1, false, stream.get());
    stream.synchronize();
    const Clock::time_point weights_ready = Clock::now();

    PlanOptions plan_options;
    plan_options.max_tokens = *std::max_element(token_counts.begin(), token_counts.end());
    plan_options.warm_up = warm_up;
    const MoeRunner runner(spec, plan_options);
    testkit::DeviceBuffer workspace(runner.workspace_bytes());
    testkit::DeviceBuffer out(static_cast<std::size_t>(plan_options.max_tokens) * spec.hidden * 2);
    const Clock::time_point planned = Clock::now();

    // inputs[index][set]: the routing seed differs per set and per T.
    std::vector<std::vector<testkit::LayerInputs>> inputs(token_counts.size());
    for (std::size_t index = 0; index < token_counts.size(); ++index) {
      for (int set = 0; set < kInputSets; ++set) {
        testkit::RoutingDraw draw;
        draw.seed = 1 + index * kInputSets + static_cast<std::uint64_t>(set);
        inputs[index].push_back(
            testkit::make_layer_inputs(weights, token_counts[index], testkit::Entry::kLogits, draw, stream.get()));
      }
    }
    const testkit::L2Reset l2_reset(static_cast<std::size_t>(testkit::current_device_info().l2_bytes));
    testkit::LaunchGate gate;
    stream.synchronize();
    const Clock::time_point inputs_ready = Clock::now();

    std::vector<FirstCall> calls;
    Clock::time_point first_output;
    for (std::size_t index = 0; index < token_counts.size(); ++index) {
      std::vector<RunArgs> set_args;
      for (const testkit::LayerInputs& set : inputs[index]) {
        RunArgs run_args = testkit::run_args(weights, set, out.get());
        run_args.workspace = workspace.get();
        run_args.workspace_size = workspace.bytes();
        set_args.push_back(run_args);
      }
      const auto run_set = [&](int run) {
        const int set = run % kInputSets;
        runner.run_from_logits(set_args[set], inputs[index][set].router_logits.get(), stream.get());
      };
      const testkit::Event start, stop;
      double enqueue_us = 0.0;   // host time inside run_from_logits of the last timed call
      // One call timed alone (the GPU idle before it), behind the gate with --gate; synchronised.
      const auto timed_call = [&](int run) {
        if (gated) gate.hold(stream.get());
        start.record(stream.get());
        const Clock::time_point enqueue_start = Clock::now();
        run_set(run);
        enqueue_us = 1e3 * ms_between(enqueue_start, Clock::now());
        stop.record(stream.get());
        if (gated) gate.release();
        stream.synchronize();
        return 1e3 * testkit::elapsed_ms(start, stop);
      };
      FirstCall call;
      call.num_tokens = token_counts[index];
      l2_reset.run(stream.get());
      stream.synchronize();
      const Clock::time_point host_start = Clock::now();
      call.first_us = timed_call(0);
      call.first_enqueue_us = enqueue_us;
      const Clock::time_point host_stop = Clock::now();
      if (index == 0) first_output = host_stop;
      call.first_host_us = 1e3 * ms_between(host_start, host_stop);

      for (int run = 0; run < kSteadyWarmup; ++run) run_set(run);
      std::vector<testkit::Event> marks(kSteadyRuns + 1);
      marks[0].record(stream.get());
      for (int run = 0; run < kSteadyRuns; ++run) {
        run_set(run);
        marks[run + 1].record(stream.get());
      }
      stream.synchronize();
      std::vector<double> pipelined_us;
      for (int run = 0; run < kSteadyRuns; ++run)
        pipelined_us.push_back(1e3 * testkit::elapsed_ms(marks[run], marks[run + 1]));
      call.pipelined_us = median(pipelined_us);

      std::vector<double> isolated_us;
      for (int run = 0; run < kIsolatedRuns; ++run) isolated_us.push_back(timed_call(run));
      call.isolated_us = median(isolated_us);

      std::vector<double> reset_us, reset_enqueue_us;
      for (int run = 0; run < kIsolatedRuns; ++run) {
        l2_reset.run(stream.get());
        stream.synchronize();
        reset_us.push_back(timed_call(run));
        reset_enqueue_us.push_back(enqueue_us);
      }
      call.reset_us = median(reset_us);
      call.enqueue_us = median(reset_enqueue_us);
      call.plan = runner.plan_info(call.num_tokens);
      calls.push_back(call);
    }

    const double weights_ms = ms_between(context_ready, weights_ready);
    const double inputs_ms = ms_between(planned, inputs_ready);
    const double cold_ms = ms_between(entry, first_output) - weights_ms - inputs_ms;
    std::printf("device: %s\n", testkit::describe(testkit::current_device_info()).c_str());
    std::printf("layer: %s %s E=%d k=%d H=%d I=%d; runner planned once for max_tokens=%d, warm-up %s, %s\n",
                preset_name.c_str(), dtype_name(spec).c_str(), spec.num_experts, spec.top_k, spec.hidden,
                spec.intermediate, plan_options.max_tokens, warm_up ? "on" : "off",
                gated ? "gated (GPU time only)" : "launches in the timed intervals");
    if (age_at_entry_ms >= 0)
      std::printf("process start -> main(): %.0f ms (/proc/self/stat, 10 ms ticks)\n", age_at_entry_ms);
    std::printf("main() -> CUDA context: %.1f ms; weights generated %.1f ms (excluded); plan + workspace %.2f ms; "
                "inputs %.1f ms (excluded)\n",
                ms_between(entry, context_ready), weights_ms, ms_between(weights_ready, planned), inputs_ms);
    std::printf("main() -> first output (T=%d), excluding weights and inputs: %.1f ms  [%s, budget %.0f ms]\n",
                token_counts.front(), cold_ms, cold_ms <= kColdStartBudgetMs ? "PASS" : "FAIL", kColdStartBudgetMs);
    std::printf("%6s %10s %13s %9s %7s  %-5s %11s %7s  %-5s %12s %9s %10s %10s  %s\n", "T", "first_us", "first_host_us",
                "reset_us", "ratio", "", "isolated_us", "ratio", "", "pipelined_us", "first/pip", "enqueue_1st", "enqueue",
                "plan");
    Worst worst_reset, worst_warm;
    double worst_pipelined_ratio = 0.0;
    for (const FirstCall& call : calls) {
      const double reset_ratio = call.first_us / call.reset_us;
      const double warm_ratio = call.first_us / call.isolated_us;
      const double pipelined_ratio = call.first_us / call.pipelined_us;
      worst_reset.add(reset_ratio, call.num_tokens);
      worst_warm.add(warm_ratio, call.num_tokens);
      worst_pipelined_ratio = std::max(worst_pipelined_ratio, pipelined_ratio);
      std::printf("%6d %10.1f %13.1f %9.1f %6.2fx  %-5s %11.1f %6.2fx  %-5s %12.1f %8.2fx %10.1f %10.1f  %s (%s)\n",
                  call.num_tokens, call.first_us, call.first_host_us, call.reset_us, reset_ratio, verdict(reset_ratio),
                  call.isolated_us, warm_ratio, verdict(warm_ratio), call.pipelined_us, pipelined_ratio,
                  call.first_enqueue_us, call.enqueue_us, plan_summary(call.plan).c_str(), call.plan.source.c_str());
    }
    for (const FirstCall& call : calls)
      std::printf("coldstart_t: T=%d first_us=%.1f reset_us=%.1f ratio=%.3f isolated_us=%.1f warm_ratio=%.3f "
                  "first_enqueue_us=%.1f enqueue_us=%.1f\n",
                  call.num_tokens, call.first_us, call.reset_us, call.first_us / call.reset_us, call.isolated_us,
                  call.first_us / call.isolated_us, call.first_enqueue_us, call.enqueue_us);
    std::printf("coldstart: model=%s dtype=%s warm_up=%d gate=%d cold_ms=%.1f exec_to_main_ms=%.0f "
                "worst_first_call_ratio=%.2f worst_T=%d (vs a warm L2 %.2f at T=%d, vs pipelined %.2f)\n",
                preset_name.c_str(), dtype_name(spec).c_str(), warm_up ? 1 : 0, gated ? 1 : 0, cold_ms, age_at_entry_ms,
                worst_reset.ratio, worst_reset.num_tokens, worst_warm.ratio, worst_warm.num_tokens,
                worst_pipelined_ratio);
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "hmoe coldstart: error: " << error.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace hmoe::cli
