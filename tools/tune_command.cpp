// `hmoe tune`: times every eligible GEMM variant pair, and the fused decode layer where it applies,
// at each token-count bucket on this GPU and writes the tuned table the dispatcher reads
// (docs/DISPATCH.md). Resumable: every measurement goes to <table>.partial as it is taken; the table
// itself is written to a temporary file and renamed.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "cli.hpp"
#include "tune_choice.hpp"
#include "decode/decode_layer.hpp"
#include "dispatch/json.hpp"
#include "dispatch/plan.hpp"
#include "dispatch/registry.hpp"
#include "dispatch/tuned_table.hpp"
#include "testkit/bench.hpp"
#include "testkit/check.hpp"
#include "testkit/device.hpp"

namespace hmoe::cli {
namespace {

namespace fs = std::filesystem;

// DESIGN.md §3 sweep: the buckets the table holds.
constexpr const char* kDefaultBuckets = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384";
// Short points keep a whole preset near a minute: ~16 pairs × 15 buckets. Graph replays of one
// layer vary by ~1% over 0.05 s on H200, below the differences worth switching variants for.
constexpr double kSecondsPerPoint = 0.05;
constexpr int kMinReplays = 10;
// Each point's untimed warm-up (bench's default 0.1 s settles the clocks of an idle GPU): the tuner's
// points follow each other with only a plan and a graph capture between them, and the default made
// the warm-ups two thirds of a tune (~0.1 of ~0.15 s a point; 40-47 s a table on the H200).
constexpr double kWarmupSecondsPerPoint = 0.02;
constexpr int kInputSets = 2;
using tools::kNoiseMargin;
// The final's points (tune_choice.hpp) are timed as `hmoe bench` times (4 input sets, 0.1 s of
// warm-up), a little shorter.
constexpr double kFinalSecondsPerPoint = 0.1;
// A pair this much slower than the best at the previous bucket, with a work granule (orientation,
// token tile) no larger than the best's, is not timed at larger T: growing T only adds tokens per
// expert, which favours larger granules. Pairs with larger granules are always timed.
constexpr double kPruneFactor = 2.0;
// The variant id of the fused decode layer's points in <table>.partial (no GEMM pair has it).
constexpr const char* kFusedId = "fused";
// What a bucket keeps is checked against the float64 reference on this many sampled tokens (plus the
// first and the last) before it goes into the table: the timed runs never read their output.
constexpr int kCheckedTokens = 4;

constexpr const char* kTuneUsage =
    "usage: hmoe tune --model PRESET [--dtype D] [--tokens T[,T...]] [--out DIR] [--points FILE]\n"
    "  --model   a preset of DESIGN.md §3 (hmoe info lists them)\n"
    "  --dtype   bf16 (default), fp8-tensor, fp8-channel or fp8-block: one table per dtype and scheme\n"
    "  --tokens  token-count buckets of the table (default the DESIGN.md §3 sweep 1,2,4,...,16384)\n"
    "  --out     directory of the table (default $HMOE_TUNED_DIR, else the source tree's tuned/)\n"
    "  --points  also write every timed point (T, variant pair, us; the .partial format) to FILE once\n"
    "            the table is written, for studying the choices beyond the kept pair (its folder must exist)\n"
    "times every GEMM variant pair that can run the preset at each bucket (CUDA-graph replays, 0.05 s\n"
    "per point after 0.02 s of warm-up), keeps the fastest unless the analytic rule's pair is within\n"
    "2%; where the two best are within 4% it re-times both as hmoe bench does (4 input sets, 0.1 s\n"
    "warm-up, ABBA) and ranks them by that final; at buckets T <= 4 it also times the fused decode\n"
    "layer (one kernel) and marks the bucket \"fused\" when that beats the kept pair by more than 2%\n"
    "(PlanOptions::fused_decode = auto then runs it there). What a bucket keeps is first checked\n"
    "against the float64 reference (4 sampled tokens; fp8-tensor above 6 tokens with static\n"
    "activation scales: the same GEMMs at a sample's cost); a pair that fails is reported and the\n"
    "next fastest kept. Writes E=..,N=..,K=..,device_name=..,dtype=...json. Progress and ETA on\n"
    "stderr. Interrupted, a rerun resumes from <table>.partial. Exit 1 if no Hopper GPU, 2 on bad\n"
    "usage\n";

using PointKey = std::pair<int, std::string>;  // (T, variant id)

struct TuneTarget {
  std::string preset_name;
  MoeSpec spec;
  std::vector<int> buckets;
  std::string out_dir;
  std::string device_name;
  std::string table_path;
  std::string partial_path;
  std::string points_path;   // --points: every timed point, written after the table (empty: none)
};

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file << text;
    file.flush();
    if (!file) throw Error("hmoe tune: cannot write " + temporary);
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    fs::remove(temporary, error);
    throw Error("hmoe tune: cannot rename " + temporary + " to " + path);
  }
}

std::string shape_fields(const TuneTarget& target) {
  std::ostringstream text;
  text << "  \"device_name\": " << dispatch::json_quote(target.device_name) << ",\n"
       << "  \"dtype\": " << dispatch::json_quote(dispatch::tuned_dtype_tag(target.spec)) << ",\n"
       << "  \"E\": " << target.spec.num_experts << ",\n  \"N\": " << target.spec.intermediate << ",\n"
       << "  \"K\": " << target.spec.hidden << ",\n";
  return text.str();
}

// The measurements of an interrupted run for the same device and shape; empty (with one line on
// stderr) when the file is unreadable or for something else.
std::map<PointKey, double> load_partial(const TuneTarget& target) {
  std::map<PointKey, double> times;
  std::ifstream file(target.partial_path, std::ios::binary);
  if (!file) return times;
  std::ostringstream text;
  text << file.rdbuf();
  try {
    const dispatch::JsonValue root = dispatch::parse_json(text.str());
    const dispatch::JsonValue* device = root.find("device_name");
    const dispatch::JsonValue* experts = root.find("E");
    const dispatch::JsonValue* n = root.find("N");
    const dispatch::JsonValue* k = root.find("K");
    const dispatch::JsonValue* dtype = root.find("dtype");
    const dispatch::JsonValue* points = root.find("points");
    if (device == nullptr || device->string != target.device_name || experts == nullptr ||
        experts->number != target.spec.num_experts || n == nullptr || n->number != target.spec.intermediate ||
        k == nullptr || k->number != target.spec.hidden || dtype == nullptr ||
        dtype->string != dispatch::tuned_dtype_tag(target.spec) || points == nullptr || !points->is_array())
      throw dispatch::JsonError("for another device, shape or dtype");
    for (const dispatch::JsonValue& point : points->items) {
      const dispatch::JsonValue* tokens = point.find("T");
      const dispatch::JsonValue* variant = point.find("variant");
      const dispatch::JsonValue* latency = point.find("us");
      if (tokens == nullptr || variant == nullptr || latency == nullptr || !latency->is_number())
        throw dispatch::JsonError("a point lacks T, variant or us");
      times[{static_cast<int>(tokens->number), variant->string}] = latency->number;
    }
    std::cerr << "hmoe tune: resuming from " << target.partial_path << " (" << times.size() << " points)\n";
  } catch (const dispatch::JsonError& error) {
    std::cerr << "hmoe tune: ignoring " << target.partial_path << ": " << error.what() << "; starting over\n";
    times.clear();
  }
  return times;
}

// Every measurement so far, as JSON: the .partial file (read back by load_partial) and --points.
std::string points_json(const TuneTarget& target, const std::map<PointKey, double>& times) {
  std::ostringstream text;
  text << "{\n  \"format\": \"hmoe-tune-partial-v1\",\n" << shape_fields(target) << "  \"points\": [";
  const char* separator = "\n";
  for (const auto& [key, latency_us] : times) {
    text << separator << "    {\"T\": " << key.first << ", \"variant\": " << dispatch::json_quote(key.second)
         << ", \"us\": " << latency_us << "}";
    separator = ",\n";
  }
  text << "\n  ]\n}\n";
  return text.str();
}

void save_partial(const TuneTarget& target, const std::map<PointKey, double>& times) {
  write_file_atomically(target.partial_path, points_json(target, times));
}

// A progress bar on stderr (redrawn in place on a terminal, a line per tenth otherwise) whose ETA
// extrapolates the time spent on points measured in this run, weighted by their expected cost.
class Progress {
 public:
  explicit Progress(double total_weight)
      : total_weight_(total_weight), terminal_(::isatty(::fileno(stderr)) != 0),
        start_(std::chrono::steady_clock::now()) {}

  static double weight(int num_tokens) { return 1.0 + num_tokens / 4096.0; }

  void advance(int num_tokens, bool measured, const std::string& label) {
    done_weight_ += weight(num_tokens);
    if (measured) measured_weight_ += weight(num_tokens);
    draw(num_tokens, label);
  }

  // Says what runs without moving the bar: the finals, which the total does not count. NOTE: their
  // time still enters the ETA's rate, which therefore reads a little long.
  void note(int num_tokens, const std::string& label) { draw(num_tokens, label); }

  void finish() {
    if (terminal_) std::fprintf(stderr, "\n");
  }

  double seconds_since_start() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  void draw(int num_tokens, const std::string& label) {
    const double fraction = std::min(1.0, done_weight_ / total_weight_);
    const double elapsed_s = seconds_since_start();
    const double eta_s = measured_weight_ > 0 ? elapsed_s / measured_weight_ * (total_weight_ - done_weight_) : 0.0;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    char line[256];
    std::snprintf(line, sizeof(line), "[%s%s] %3.0f%%  %5.0fs  ETA %4.0fs  T=%-5d %s",
                  std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(), 100 * fraction,
                  elapsed_s, std::max(eta_s, 0.0), num_tokens, label.c_str());
    if (terminal_) {
      std::fprintf(stderr, "\r%-120s", line);
    } else if (static_cast<int>(fraction * 10) > last_tenth_) {
      last_tenth_ = static_cast<int>(fraction * 10);
      std::fprintf(stderr, "%s\n", line);
    }
    std::fflush(stderr);
  }

  double total_weight_;
  bool terminal_;
  std::chrono::steady_clock::time_point start_;
  double done_weight_ = 0.0;
  double measured_weight_ = 0.0;
  int last_tenth_ = -1;
};

// One tuning point: T tokens, short, no floor measurement; the caller names what runs.
testkit::BenchOptions point_options(int num_tokens) {
  testkit::BenchOptions options;
  options.token_counts = {num_tokens};
  options.seconds_per_point = kSecondsPerPoint;
  options.min_replays = kMinReplays;
  options.warmup_seconds = kWarmupSecondsPerPoint;
  options.input_sets = kInputSets;
  options.measure_floor = false;
  return options;
}

std::string analytic_id(const MoeSpec& spec, int num_tokens) {
  const dispatch::Plan plan = dispatch::choose_plan(spec, num_tokens, Orientation::kAuto);
  return dispatch::PlanVariant{plan.gemm1, plan.gemm2}.id();
}

// Static fp8-tensor activation scales for one check (the timed runs keep the dynamic ones).
class StaticScalesWhileChecking {
 public:
  StaticScalesWhileChecking(testkit::LayerWeights& weights, bool active) : weights_(weights), active_(active) {
    if (!active_) return;
    const testkit::Stream stream;
    testkit::set_static_act_scales(weights_, true, stream.get());
  }
  ~StaticScalesWhileChecking() {
    if (active_) testkit::set_static_act_scales(weights_, false, nullptr);   // allocates nothing: no stream
  }
  StaticScalesWhileChecking(const StaticScalesWhileChecking&) = delete;
  StaticScalesWhileChecking& operator=(const StaticScalesWhileChecking&) = delete;

 private:
  testkit::LayerWeights& weights_;
  bool active_;
};

struct BucketChoice {
  int num_tokens = 0;
  std::string chosen;        // the unfused pair, also where the bucket is fused
  double chosen_us = 0.0;    // the time of what runs: the fused layer's when fused
  std::string analytic;
  double analytic_us = 0.0;
  bool fused = false;        // the fused decode layer beat the chosen pair by more than the noise margin
  double unfused_us = 0.0;   // the chosen pair's time (fused buckets only)
};

int tune(const TuneTarget& target, const std::vector<std::string>& args) {
  const MoeSpec& spec = target.spec;
  const std::vector<dispatch::PlanVariant> candidates = dispatch::eligible_plan_variants(spec);
  if (candidates.empty()) throw Error("hmoe tune: no compiled variant pair can run this layer");
  std::map<PointKey, double> times = load_partial(target);

  std::printf("tuning %s (E=%d k=%d H=%d I=%d %s) on %s: %zu variant pairs x %zu buckets\n",
              target.preset_name.c_str(), spec.num_experts, spec.top_k, spec.hidden, spec.intermediate,
              dtype_name(spec).c_str(),
              target.device_name.c_str(), candidates.size(), target.buckets.size());
  std::fflush(stdout);
  testkit::LayerWeights weights;
  {
    const testkit::Stream stream;
    // The host copy feeds the reference check of each kept pair.
    weights = testkit::make_layer_weights(spec, /*seed=*/1, /*keep_host_copy=*/true, stream.get());
    stream.synchronize();
  }

  // HMOE_FUSED_DECODE=0 overrides FusedDecode::kOn: the fused layer cannot run, so it is not timed.
  if (dispatch::fused_decode_environment() == 0)
    std::cerr << "hmoe tune: HMOE_FUSED_DECODE=0: the fused decode layer is not timed; the table gets no "
                 "\"fused\" buckets\n";
  double total_weight = 0.0;
  for (int num_tokens : target.buckets)
    total_weight += Progress::weight(num_tokens) * (candidates.size() + (decode::applies(spec, num_tokens) ? 1 : 0));
  Progress progress(total_weight);
  std::vector<BucketChoice> choices;
  std::vector<std::string> finals;   // one line per bucket that played a final
  int measured_points = 0;
  int checked_points = 0;    // kept pairs (and fused layers) checked against the reference
  int rejected_points = 0;   // of those, failed and left out
  int previous_bucket = 0;
  for (int num_tokens : target.buckets) {
    const std::string analytic = analytic_id(spec, num_tokens);
    // The previous bucket's winner, for pruning.
    double previous_best_us = 0.0;
    int previous_best_rank = 0;
    for (const dispatch::PlanVariant& candidate : candidates) {
      const auto found = times.find({previous_bucket, candidate.id()});
      if (found != times.end() && (previous_best_us == 0.0 || found->second < previous_best_us)) {
        previous_best_us = found->second;
        previous_best_rank = dispatch::granule_rank(*candidate.gemm1);
      }
    }
    for (const dispatch::PlanVariant& candidate : candidates) {
      const std::string id = candidate.id();
      if (times.count({num_tokens, id}) != 0) {
        progress.advance(num_tokens, false, candidate.summary() + " (resumed)");
        continue;
      }
      if (previous_best_us > 0.0 && id != analytic &&
          dispatch::granule_rank(*candidate.gemm1) <= previous_best_rank) {
        const auto previous = times.find({previous_bucket, id});
        if (previous == times.end() || previous->second > kPruneFactor * previous_best_us) {
          progress.advance(num_tokens, false, candidate.summary() + " (pruned)");
          continue;
        }
      }
      testkit::BenchOptions options = point_options(num_tokens);
      options.force_variant = id;
      times[{num_tokens, id}] = testkit::bench_layer(weights, options).front().median_us;
      save_partial(target, times);
      ++measured_points;
      progress.advance(num_tokens, true, candidate.summary());
    }
    // The fused decode layer: one more candidate wherever it applies, never pruned.
    if (decode::applies(spec, num_tokens)) {
      if (times.count({num_tokens, kFusedId}) != 0) {
        progress.advance(num_tokens, false, "fused layer (resumed)");
      } else if (dispatch::fused_decode_environment() == 0) {
        progress.advance(num_tokens, false, "fused layer (not timed: HMOE_FUSED_DECODE=0)");
      } else {
        testkit::BenchOptions options = point_options(num_tokens);
        options.fused_decode = FusedDecode::kOn;
        const testkit::BenchRow row = testkit::bench_layer(weights, options).front();
        if (!row.plan.fused_decode)
          throw Error("hmoe tune: internal error: the fused decode layer did not run at T = " +
                      std::to_string(num_tokens));
        times[{num_tokens, kFusedId}] = row.median_us;
        save_partial(target, times);
        ++measured_points;
        progress.advance(num_tokens, true, "fused layer");
      }
    }
    // What runs must also be right: the kept pair (and the fused layer where it wins) is checked
    // against the float64 reference at this T; one that fails is reported, left out, and the next
    // fastest is kept. NOTE: the analytic pair failing is a library bug, not a tuning choice: throw.
    const auto check = [&](const std::string& id, bool fused_layer) {
      testkit::CheckOptions options;
      options.num_tokens = num_tokens;
      options.max_reference_tokens = kCheckedTokens;
      options.force_variant = fused_layer ? std::string() : id;
      options.fused_decode = fused_layer ? FusedDecode::kOn : FusedDecode::kOff;
      // fp8-tensor's dynamic intermediate scale is the amax over every token's GEMM1 output, so the
      // reference of a sampled check would still run GEMM1 on all T tokens (minutes for
      // mixtral-8x7b at T = 16384). The pair's kernels are the same with static scales (the amax is a
      // separate pass), so sampled buckets check with those: a sample's cost, the same GEMMs.
      const StaticScalesWhileChecking scales(weights,
                                             spec.scheme == QuantScheme::kPerTensor && num_tokens > kCheckedTokens + 2);
      const testkit::CheckResult result = testkit::check_layer(weights, options);
      ++checked_points;
      if (!result.passed) {
        ++rejected_points;
        std::fprintf(stderr, "\nhmoe tune: T=%d %s FAILED the reference check (rel_err %.3g, bound %.3g, "
                     "unwritten %zu, non-finite %zu): left out of the table\n",
                     num_tokens, fused_layer ? "fused layer" : id.c_str(), result.rel_error, result.tolerance,
                     result.unwritten, result.nonfinite);
      }
      return result.passed;
    };
    BucketChoice choice;
    choice.num_tokens = num_tokens;
    choice.analytic = analytic;
    choice.analytic_us = times.at({num_tokens, analytic});
    std::vector<tools::TimedPair> scan;
    for (const dispatch::PlanVariant& candidate : candidates) {
      const auto found = times.find({num_tokens, candidate.id()});
      if (found != times.end()) scan.push_back({candidate.id(), found->second});
    }
    // Close calls of the scan are settled by a final timed as `hmoe bench` times. NOTE: not kept in
    // <table>.partial: a resumed run plays the finals again (a second or so a bucket).
    const std::vector<std::string> finalists = tools::finalists(scan, analytic);
    std::map<std::string, double> final_us;
    for (int round = 0; round < tools::kFinalRounds; ++round) {
      for (const std::string& id : tools::final_round_order(finalists, round)) {
        testkit::BenchOptions options = point_options(num_tokens);
        options.force_variant = id;
        options.input_sets = testkit::BenchOptions{}.input_sets;
        options.warmup_seconds = testkit::BenchOptions{}.warmup_seconds;
        options.seconds_per_point = kFinalSecondsPerPoint;
        final_us[id] += testkit::bench_layer(weights, options).front().median_us / tools::kFinalRounds;
        progress.note(num_tokens, dispatch::parse_plan_variant(id, spec).summary() + " (final)");
      }
    }
    for (const std::string& id : tools::preference_order(scan, analytic, final_us)) {
      choice.chosen = id;
      if (check(id, false)) break;
      if (id == analytic)
        throw Error("hmoe tune: the analytic rule's pair " + analytic + " fails the reference check at T = " +
                    std::to_string(num_tokens) + ": a library bug (run hmoe check; see docs/RELIABILITY.md)");
    }
    if (!finalists.empty()) {
      std::string line = "T=" + std::to_string(num_tokens) + " final:";
      for (const std::string& id : finalists) {
        char text[160];
        std::snprintf(text, sizeof(text), " %s%s scan %.1f us, final %.1f us;",
                      dispatch::parse_plan_variant(id, spec).summary().c_str(), id == analytic ? " (analytic)" : "",
                      times.at({num_tokens, id}), final_us.at(id));
        line += text;
      }
      finals.push_back(line + " keeps " + dispatch::parse_plan_variant(choice.chosen, spec).summary());
    }
    choice.chosen_us = times.at({num_tokens, choice.chosen});
    // The same margin for the fused layer, against the pair it would replace.
    const auto fused = times.find({num_tokens, kFusedId});
    if (fused != times.end() && decode::applies(spec, num_tokens) && fused->second * kNoiseMargin < choice.chosen_us &&
        check(kFusedId, true)) {
      choice.fused = true;
      choice.unfused_us = choice.chosen_us;
      choice.chosen_us = fused->second;
    } else if (final_us.count(choice.chosen) != 0 && final_us.count(analytic) != 0) {
      // Both timed in the final: the table and the summary compare them as the final did.
      choice.chosen_us = final_us.at(choice.chosen);
      choice.analytic_us = final_us.at(analytic);
    }
    choices.push_back(choice);
    previous_bucket = num_tokens;
  }
  progress.finish();

  // The table.
  std::string command_line = "hmoe tune";
  for (const std::string& arg : args) command_line += " " + arg;
  std::ostringstream table;
  table << "{\n  \"format\": \"hmoe-tuned-v1\",\n" << shape_fields(target)
        << "  \"model\": " << dispatch::json_quote(target.preset_name) << ",\n"
        << "  \"hmoe_version\": " << dispatch::json_quote(version()) << ",\n"
        << "  \"command\": " << dispatch::json_quote(command_line) << ",\n  \"buckets\": {";
  const char* separator = "\n";
  for (const BucketChoice& choice : choices) {
    const std::size_t plus = choice.chosen.find('+');
    char latencies[128];
    std::snprintf(latencies, sizeof(latencies), "\"us\": %.2f, \"analytic_us\": %.2f", choice.chosen_us,
                  choice.analytic_us);
    char fused_fields[64] = "";
    if (choice.fused)
      std::snprintf(fused_fields, sizeof(fused_fields), ", \"unfused_us\": %.2f, \"fused\": true", choice.unfused_us);
    table << separator << "    \"" << choice.num_tokens << "\": {\"gemm1\": "
          << dispatch::json_quote(choice.chosen.substr(0, plus))
          << ", \"gemm2\": " << dispatch::json_quote(choice.chosen.substr(plus + 1)) << ", " << latencies
          << fused_fields << "}";
    separator = ",\n";
  }
  table << "\n  }\n}\n";
  // Check what is written reads back as a valid table before it replaces anything.
  std::string error;
  write_file_atomically(target.table_path + ".check", table.str());
  const bool readable = dispatch::read_tuned_table(target.table_path + ".check", spec, target.device_name, &error) != nullptr;
  std::error_code ignored;
  fs::remove(target.table_path + ".check", ignored);
  if (!readable) throw Error("hmoe tune: the table does not read back (" + error + "); " + target.partial_path + " kept");
  write_file_atomically(target.table_path, table.str());
  if (!target.points_path.empty()) write_file_atomically(target.points_path, points_json(target, times));
  fs::remove(target.partial_path, ignored);

  for (const std::string& line : finals) std::printf("%s\n", line.c_str());
  // What tuning gained: the final's times where the kept pair and the analytic one both played it, else the scan's.
  std::printf("%6s  %-24s %10s  %-24s %10s %8s\n", "T", "analytic rule", "us", "tuned choice", "us", "speed-up");
  double log_vs_analytic = 0.0;
  for (const BucketChoice& choice : choices) {
    const auto summary = [&](const std::string& id) { return dispatch::parse_plan_variant(id, spec).summary(); };
    const std::string tuned = choice.fused ? "fused layer" : summary(choice.chosen);
    std::printf("%6d  %-24s %10.1f  %-24s %10.1f %7.3fx\n", choice.num_tokens, summary(choice.analytic).c_str(),
                choice.analytic_us, tuned.c_str(), choice.chosen_us, choice.analytic_us / choice.chosen_us);
    log_vs_analytic += std::log(choice.analytic_us / choice.chosen_us);
  }
  // The best single pair: the lowest geometric-mean latency among pairs timed at every bucket (the
  // fused layer is no pair: it runs at T <= 4 only), held against what the table runs.
  std::string best_single;
  double best_single_log = 0.0;
  for (const dispatch::PlanVariant& candidate : candidates) {
    double log_sum = 0.0;
    bool complete = true;
    for (const BucketChoice& choice : choices) {
      const auto found = times.find({choice.num_tokens, candidate.id()});
      if (found == times.end()) {
        complete = false;
        break;
      }
      log_sum += std::log(found->second / choice.chosen_us);
    }
    if (complete && (best_single.empty() || log_sum < best_single_log)) {
      best_single = candidate.id();
      best_single_log = log_sum;
    }
  }
  const double buckets = static_cast<double>(choices.size());
  std::printf("summary: model=%s buckets=%zu measured_points=%d checked=%d rejected=%d seconds=%.1f "
              "tuned_vs_analytic=%.3fx tuned_vs_best_single=%s best_single=%s\n",
              target.preset_name.c_str(), choices.size(), measured_points, checked_points, rejected_points,
              progress.seconds_since_start(),
              std::exp(log_vs_analytic / buckets),
              best_single.empty() ? "n/a" : (std::to_string(std::exp(best_single_log / buckets)).substr(0, 5) + "x").c_str(),
              best_single.empty() ? "none-complete" : dispatch::parse_plan_variant(best_single, spec).summary().c_str());
  std::printf("wrote %s\n", target.table_path.c_str());
  return 0;
}

}  // namespace

int run_tune(const std::vector<std::string>& args) {
  TuneTarget target;
  try {
    const ParsedOptions parsed = parse_options(args, {"--model", "--dtype", "--tokens", "--out", "--points"});
    if (parsed.help) {
      std::cout << kTuneUsage;
      return 0;
    }
    if (!parsed.has("--model")) throw UsageError("missing --model PRESET");
    target.preset_name = parsed.get("--model", "");
    target.spec = parse_preset(target.preset_name);
    apply_dtype(parsed.get("--dtype", "bf16"), target.spec);
    target.buckets = parse_token_list(parsed.get("--tokens", kDefaultBuckets));
    std::sort(target.buckets.begin(), target.buckets.end());
    target.buckets.erase(std::unique(target.buckets.begin(), target.buckets.end()), target.buckets.end());
    target.out_dir = parsed.get("--out", dispatch::default_tuned_dir());
    if (parsed.has("--points")) {
      target.points_path = parsed.get("--points", "");
      const fs::path folder = fs::absolute(fs::path(target.points_path)).parent_path();
      if (target.points_path.empty() || fs::path(target.points_path).filename().empty() || !fs::is_directory(folder))
        throw UsageError("--points '" + target.points_path + "': needs a file name in an existing folder");
    }
  } catch (const UsageError& error) {
    return usage_error("tune", error.what(), kTuneUsage);
  }
  if (report_if_no_hopper_gpu("tune")) return kExitFailure;
  try {
    target.device_name = dispatch::current_device_name();
    std::error_code error;
    fs::create_directories(target.out_dir, error);
    if (error) throw Error("hmoe tune: cannot create --out " + target.out_dir + ": " + error.message());
    target.table_path = (fs::path(target.out_dir) / dispatch::tuned_file_name(target.spec, target.device_name)).string();
    target.partial_path = target.table_path + ".partial";
    return tune(target, args);
  } catch (const std::exception& error) {
    std::cerr << "\nhmoe tune: error: " << error.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace hmoe::cli
