// Shared pieces of the `hmoe` subcommands: option parsing, the value parsers whose failures are
// usage errors (exit 2), and the entry points main() dispatches to.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "hmoe/hmoe.hpp"
#include "testkit/random_inputs.hpp"

namespace hmoe::cli {

// Exit statuses: 1 = the command ran and failed (or cannot run here), 2 = it was called wrongly.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// A malformed command line; main prints the message and the command's usage, then exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ParsedOptions {
  bool help = false;
  std::map<std::string, std::string> values;  // "--name" → value
  std::set<std::string> flags;                // "--name" of each flag given

  bool has(const std::string& name) const { return values.count(name) != 0; }
  bool flag(const std::string& name) const { return flags.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
};

// Accepts "--name value" and "--name=value" for the names in value_options, "--name" alone for the
// names in flag_options, and --help / -h.
ParsedOptions parse_options(const std::vector<std::string>& args, const std::vector<std::string>& value_options,
                            const std::vector<std::string>& flag_options = {});

MoeSpec parse_preset(const std::string& name);
// "1,2,4": positive integers separated by commas.
std::vector<int> parse_token_list(const std::string& text);
int parse_positive_int(const std::string& option, const std::string& text);
// An integer in 1..most, else a usage error naming the option and the range.
int parse_count(const std::string& option, const std::string& text, int most);
std::uint64_t parse_seed(const std::string& text);
Orientation parse_orientation(const std::string& text);
// --fused-decode auto|on|off (PlanOptions::fused_decode).
FusedDecode parse_fused_decode(const std::string& text);
// --split-k: "auto" (0, hmoe's rule) or a count >= 1 (1: never split).
int parse_split_k(const std::string& text);
testkit::RoutingMode parse_routing(const std::string& text);
testkit::Entry parse_entry_option(const std::string& text);
// --dtype bf16 | fp8-tensor | fp8-channel | fp8-block: sets spec's weight dtype and scheme; a
// scheme the shape cannot run (fp8-block needs H and I multiples of 128) is a usage error.
void apply_dtype(const std::string& dtype, MoeSpec& spec);
// The --dtype word of a spec: "bf16", or its FP8 scheme ("fp8-block", ...).
std::string dtype_name(const MoeSpec& spec);
// The --dtype line every GPU command's usage shares.
inline constexpr const char* kDtypeHelp =
    "  --dtype        bf16 (default), or FP8 e4m3 weights and activations: fp8-tensor (per-tensor scales),\n"
    "                 fp8-channel (per-channel weights x per-token activations), fp8-block (128x128 weight\n"
    "                 blocks x 1x128 activation groups)\n";

// "swap 64x8 split-K 4/1": orientation, weight x token tile, K splits of GEMM1/GEMM2 when either splits;
// with requested_split_k > 1 (--split-k N) also where either GEMM split fewer ways than asked, "(asked N)".
std::string plan_summary(const PlanInfo& plan, int requested_split_k = 0);
// The one line a GPU command prints (to stderr) when this machine cannot run it.
bool report_if_no_hopper_gpu(const std::string& command);

// The tree this binary was built from (cmake/build_id.cmake, at build time), e.g. "3b2ae54fcd72" or
// "3b2ae54fcd72-dirty.1f0c9a2e" (the diff's hash); a binary a build did not relink shows the older one.
const char* build_id();
// "hmoe <version> (build <build_id>)": the first line of `hmoe info`, and `hmoe bench`'s "build:" line.
std::string build_description();

// Prints "hmoe <command>: <message>" and the usage to stderr; returns kExitUsage.
int usage_error(const std::string& command, const std::string& message, const char* usage);

// Subcommands: take the arguments after the command name, return the exit status.
int run_info(const std::vector<std::string>& args);
int run_check(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_tune(const std::vector<std::string>& args);
int run_coldstart(const std::vector<std::string>& args);
int run_quantize(const std::vector<std::string>& args);
int run_trace(const std::vector<std::string>& args);

// The steady-clock time main() was entered (recorded first thing), for `hmoe coldstart`.
void record_main_entry();
std::chrono::steady_clock::time_point main_entry_time();

}  // namespace hmoe::cli
