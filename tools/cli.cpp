// Option parsing for the hmoe CLI: every malformed value becomes a UsageError naming the option.
#include "cli.hpp"

#include <algorithm>
#include <charconv>
#include <iostream>
#include <sstream>

#include "testkit/device.hpp"

namespace hmoe::cli {
namespace {

bool parse_int(const std::string& text, long long* value) {
  const char* end = text.data() + text.size();
  const auto [stop, status] = std::from_chars(text.data(), end, *value);
  return status == std::errc() && stop == end && !text.empty();
}

}  // namespace

std::string ParsedOptions::get(const std::string& name, const std::string& fallback) const {
  const auto found = values.find(name);
  return found == values.end() ? fallback : found->second;
}

ParsedOptions parse_options(const std::vector<std::string>& args, const std::vector<std::string>& value_options,
                            const std::vector<std::string>& flag_options) {
  ParsedOptions parsed;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      parsed.help = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + arg + "'");
    const std::size_t equals = arg.find('=');
    const std::string name = arg.substr(0, equals);
    if (std::find(flag_options.begin(), flag_options.end(), name) != flag_options.end()) {
      if (equals != std::string::npos) throw UsageError("option " + name + " takes no value");
      if (!parsed.flags.insert(name).second) throw UsageError("option " + name + " given twice");
      continue;
    }
    bool known = false;
    for (const std::string& option : value_options) known = known || option == name;
    if (!known) throw UsageError("unknown option '" + name + "'");
    if (parsed.has(name)) throw UsageError("option " + name + " given twice");
    if (equals != std::string::npos) {
      parsed.values[name] = arg.substr(equals + 1);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      parsed.values[name] = args[++i];
    } else {
      throw UsageError("option " + name + " needs a value");
    }
    if (parsed.values[name].empty()) throw UsageError("option " + name + " needs a value");
  }
  return parsed;
}

MoeSpec parse_preset(const std::string& name) {
  try {
    return preset(name);
  } catch (const Error& error) {
    throw UsageError(error.what());
  }
}

std::vector<int> parse_token_list(const std::string& text) {
  std::vector<int> tokens;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) tokens.push_back(parse_positive_int("--tokens", item));
  if (tokens.empty() || text.back() == ',')
    throw UsageError("--tokens '" + text + "': expected positive integers separated by commas");
  return tokens;
}

int parse_positive_int(const std::string& option, const std::string& text) {
  long long value = 0;
  if (!parse_int(text, &value)) throw UsageError(option + " '" + text + "': expected an integer");
  if (value < 1 || value > (1LL << 30)) throw UsageError(option + " " + text + ": expected 1..2^30");
  return static_cast<int>(value);
}

std::uint64_t parse_seed(const std::string& text) {
  long long value = 0;
  if (!parse_int(text, &value) || value < 0) throw UsageError("--seed '" + text + "': expected an integer >= 0");
  return static_cast<std::uint64_t>(value);
}

Orientation parse_orientation(const std::string& text) {
  for (Orientation orientation : {Orientation::kAuto, Orientation::kNormal, Orientation::kSwapAB})
    if (text == to_string(orientation)) return orientation;
  throw UsageError("--orientation '" + text + "': expected auto, normal or swap");
}

FusedDecode parse_fused_decode(const std::string& text) {
  if (text == "auto") return FusedDecode::kAuto;
  if (text == "on") return FusedDecode::kOn;
  if (text == "off") return FusedDecode::kOff;
  throw UsageError("--fused-decode '" + text + "': expected auto, on or off");
}

int parse_count(const std::string& option, const std::string& text, int most) {
  long long value = 0;
  if (!parse_int(text, &value) || value < 1 || value > most)
    throw UsageError(option + " '" + text + "': expected a count 1.." + std::to_string(most));
  return static_cast<int>(value);
}

int parse_split_k(const std::string& text) {
  if (text == "auto") return 0;
  long long value = 0;
  if (!parse_int(text, &value) || value < 1 || value > 64)
    throw UsageError("--split-k '" + text + "': expected auto or a count 1..64 (1: never split K)");
  return static_cast<int>(value);
}

testkit::RoutingMode parse_routing(const std::string& text) {
  if (const auto mode = testkit::parse_routing_mode(text)) return *mode;
  throw UsageError("--routing '" + text + "': expected uniform, zipf or extreme");
}

testkit::Entry parse_entry_option(const std::string& text) {
  if (const auto entry = testkit::parse_entry(text)) return *entry;
  throw UsageError("--entry '" + text + "': expected logits or topk");
}

std::string dtype_name(const MoeSpec& spec) {
  return spec.weight_dtype == WeightDType::kBF16 ? "bf16" : to_string(spec.scheme);
}

void apply_dtype(const std::string& dtype, MoeSpec& spec) {
  if (dtype == "bf16") {
    spec.weight_dtype = WeightDType::kBF16;
    spec.scheme = QuantScheme::kNone;
    return;
  }
  for (QuantScheme scheme : {QuantScheme::kPerTensor, QuantScheme::kPerChannelPerToken, QuantScheme::kBlock128}) {
    if (dtype != to_string(scheme)) continue;
    spec.weight_dtype = WeightDType::kFP8E4M3;
    spec.scheme = scheme;
    try {
      validate(spec);
    } catch (const Error& error) {
      throw UsageError("--dtype " + dtype + ": " + error.what());
    }
    return;
  }
  throw UsageError("--dtype '" + dtype + "': expected bf16, fp8-tensor, fp8-channel or fp8-block");
}

std::string plan_summary(const PlanInfo& plan, int requested_split_k) {
  if (plan.fused_decode) return "fused layer";
  std::string summary =
      to_string(plan.orientation) + " " + std::to_string(plan.weight_tile) + "x" + std::to_string(plan.token_tile);
  // --split-k N is a ceiling: K, the split workspace and the orientation may leave a GEMM fewer ways.
  const bool capped = requested_split_k > 1 && std::min(plan.gemm1_splits, plan.gemm2_splits) < requested_split_k;
  if (plan.gemm1_splits > 1 || plan.gemm2_splits > 1 || capped)
    summary += " split-K " + std::to_string(plan.gemm1_splits) + "/" + std::to_string(plan.gemm2_splits);
  if (capped) summary += " (asked " + std::to_string(requested_split_k) + ")";
  return summary;
}

int usage_error(const std::string& command, const std::string& message, const char* usage) {
  std::cerr << "hmoe " << command << ": " << message << "\n" << usage;
  return kExitUsage;
}

namespace {
std::chrono::steady_clock::time_point main_entry = std::chrono::steady_clock::now();
}  // namespace

void record_main_entry() { main_entry = std::chrono::steady_clock::now(); }
std::chrono::steady_clock::time_point main_entry_time() { return main_entry; }

bool report_if_no_hopper_gpu(const std::string& command) {
  std::string reason;
  if (testkit::hopper_gpu_available(&reason)) return false;
  std::cerr << "hmoe " << command << ": no Hopper GPU: " << reason << "\n";
  return true;
}

}  // namespace hmoe::cli
