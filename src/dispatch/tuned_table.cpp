// Finding, reading and validating tuned tables, and applying them (or a forced variant) to a plan.
#include "dispatch/tuned_table.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "decode/decode_layer.hpp"
#include "dispatch/json.hpp"

#ifndef HMOE_DEFAULT_TUNED_DIR
#define HMOE_DEFAULT_TUNED_DIR "tuned"
#endif

namespace hmoe::dispatch {
namespace {

namespace fs = std::filesystem;

void warn_once(const std::string& key, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  const std::lock_guard<std::mutex> lock(mutex);
  if (warned.insert(key).second) std::cerr << "hmoe: warning: " << message << "\n";
}

std::string executable_dir() {
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  return error ? std::string() : exe.parent_path().string();
}

// A required member of the table's top-level object, of the given kind.
const JsonValue& member(const JsonValue& object, const char* key, JsonValue::Kind kind, const char* kind_name) {
  const JsonValue* value = object.find(key);
  if (value == nullptr) throw JsonError(std::string("missing \"") + key + "\"");
  if (value->kind != kind) throw JsonError(std::string("\"") + key + "\" is not " + kind_name);
  return *value;
}

int integer_member(const JsonValue& object, const char* key) {
  const double number = member(object, key, JsonValue::Kind::kNumber, "a number").number;
  if (number != std::floor(number) || number < 0 || number > 1e9)
    throw JsonError(std::string("\"") + key + "\" is not a non-negative integer");
  return static_cast<int>(number);
}

TunedTable parse_table(const std::string& text, const MoeSpec& spec, std::string_view device_name) {
  const JsonValue root = parse_json(text);
  if (!root.is_object()) throw JsonError("the file is not a JSON object");
  // Stale: a table for another shape, device or dtype than its name says.
  const int experts = integer_member(root, "E");
  const int n = integer_member(root, "N");
  const int k = integer_member(root, "K");
  if (experts != spec.num_experts || n != spec.intermediate || k != spec.hidden)
    throw JsonError("shape E=" + std::to_string(experts) + ",N=" + std::to_string(n) + ",K=" + std::to_string(k) +
                    " does not match the layer (E=" + std::to_string(spec.num_experts) + ",N=" +
                    std::to_string(spec.intermediate) + ",K=" + std::to_string(spec.hidden) + ")");
  const std::string& device = member(root, "device_name", JsonValue::Kind::kString, "a string").string;
  if (device != device_name)
    throw JsonError("tuned on \"" + device + "\", this device is \"" + std::string(device_name) + "\"");
  const std::string& dtype = member(root, "dtype", JsonValue::Kind::kString, "a string").string;
  if (dtype != tuned_dtype_tag(spec)) throw JsonError("dtype \"" + dtype + "\", the layer is " + tuned_dtype_tag(spec));

  const JsonValue& buckets = member(root, "buckets", JsonValue::Kind::kObject, "an object");
  TunedTable table;
  for (std::size_t i = 0; i < buckets.keys.size(); ++i) {
    const std::string& key = buckets.keys[i];
    const JsonValue& entry = buckets.items[i];
    TunedBucket bucket;
    try {
      std::size_t used = 0;
      bucket.num_tokens = std::stoi(key, &used);
      if (used != key.size() || bucket.num_tokens < 1) throw std::invalid_argument(key);
    } catch (const std::logic_error&) {
      throw JsonError("bucket \"" + key + "\" is not a positive token count");
    }
    if (!entry.is_object()) throw JsonError("bucket \"" + key + "\" is not an object");
    const std::string& gemm1 = member(entry, "gemm1", JsonValue::Kind::kString, "a string").string;
    const std::string& gemm2 = member(entry, "gemm2", JsonValue::Kind::kString, "a string").string;
    try {
      bucket.variant = parse_plan_variant(gemm1 + "+" + gemm2, spec);
    } catch (const Error& error) {
      throw JsonError("bucket \"" + key + "\": " + error.what());
    }
    if (const JsonValue* latency = entry.find("us"); latency != nullptr && latency->is_number())
      bucket.latency_us = latency->number;
    if (const JsonValue* fused = entry.find("fused"); fused != nullptr) {
      if (fused->kind != JsonValue::Kind::kBool)
        throw JsonError("bucket \"" + key + "\": \"fused\" is not a boolean");
      bucket.fused_decode = fused->boolean;
      if (bucket.fused_decode && bucket.num_tokens > decode::kMaxTokens)
        throw JsonError("bucket \"" + key + "\": \"fused\" is true above the fused decode layer's " +
                        std::to_string(decode::kMaxTokens) + " tokens");
    }
    table.buckets.push_back(bucket);
  }
  if (table.buckets.empty()) throw JsonError("\"buckets\" is empty");
  std::sort(table.buckets.begin(), table.buckets.end(),
            [](const TunedBucket& a, const TunedBucket& b) { return a.num_tokens < b.num_tokens; });
  for (std::size_t i = 1; i < table.buckets.size(); ++i)
    if (table.buckets[i].num_tokens == table.buckets[i - 1].num_tokens)
      throw JsonError("bucket " + std::to_string(table.buckets[i].num_tokens) + " appears twice");
  return table;
}

}  // namespace

const TunedBucket& TunedTable::bucket_for(int num_tokens) const {
  const auto upper = std::lower_bound(buckets.begin(), buckets.end(), num_tokens,
                                      [](const TunedBucket& bucket, int tokens) { return bucket.num_tokens < tokens; });
  if (upper == buckets.begin()) return buckets.front();
  if (upper == buckets.end()) return buckets.back();
  const auto lower = upper - 1;
  // Nearer on a log scale: T² against lower·upper.
  const double t = num_tokens;
  return t * t <= static_cast<double>(lower->num_tokens) * upper->num_tokens ? *lower : *upper;
}

std::string tuned_dtype_tag(const MoeSpec& spec) {
  // vLLM's tags: "fp8_w8a8" for every FP8 scheme; hmoe tells per-channel apart (its kernels differ).
  switch (spec.scheme) {
    case QuantScheme::kNone: return "bf16";
    case QuantScheme::kPerChannelPerToken: return "fp8_w8a8_per_channel";
    default: return "fp8_w8a8";
  }
}

std::string tuned_device_tag(std::string_view device_name) {
  std::string tag(device_name);
  std::replace(tag.begin(), tag.end(), ' ', '_');
  return tag;
}

std::string tuned_file_name(const MoeSpec& spec, std::string_view device_name) {
  return "E=" + std::to_string(spec.num_experts) + ",N=" + std::to_string(spec.intermediate) +
         ",K=" + std::to_string(spec.hidden) + ",device_name=" + tuned_device_tag(device_name) +
         ",dtype=" + tuned_dtype_tag(spec) + (spec.scheme == QuantScheme::kBlock128 ? ",block_shape=[128,128]" : "") +
         ".json";
}

std::vector<std::string> tuned_search_dirs() {
  if (const char* env = std::getenv(kTunedDirEnv); env != nullptr && *env != '\0') {
    std::error_code error;
    if (!fs::is_directory(env, error))
      warn_once(std::string("env:") + env, std::string(kTunedDirEnv) + "=" + env +
                                               " is not a directory; no tuned table applies (analytic rule)");
    return {env};
  }
  std::vector<std::string> dirs;
  if (const std::string exe_dir = executable_dir(); !exe_dir.empty())
    dirs.push_back((fs::path(exe_dir) / ".." / "share" / "hmoe" / "tuned").lexically_normal().string());
  dirs.push_back(HMOE_DEFAULT_TUNED_DIR);
  return dirs;
}

std::string default_tuned_dir() {
  if (const char* env = std::getenv(kTunedDirEnv); env != nullptr && *env != '\0') return env;
  return HMOE_DEFAULT_TUNED_DIR;
}

std::shared_ptr<const TunedTable> read_tuned_table(const std::string& path, const MoeSpec& spec,
                                                   std::string_view device_name, std::string* error) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    if (error != nullptr) *error = "cannot open the file";
    return nullptr;
  }
  std::ostringstream text;
  text << file.rdbuf();
  try {
    auto table = std::make_shared<TunedTable>(parse_table(text.str(), spec, device_name));
    table->path = path;
    table->source = "tuned:" + fs::path(path).filename().string();
    return table;
  } catch (const JsonError& parse_error) {
    if (error != nullptr) *error = parse_error.what();
    return nullptr;
  }
}

std::shared_ptr<const TunedTable> find_tuned_table(const MoeSpec& spec, std::string_view device_name) {
  if (device_name.empty()) return nullptr;
  const std::string name = tuned_file_name(spec, device_name);
  for (const std::string& dir : tuned_search_dirs()) {
    const std::string path = (fs::path(dir) / name).string();
    std::error_code exists_error;
    if (!fs::is_regular_file(path, exists_error)) continue;

    static std::mutex mutex;
    static std::map<std::string, std::shared_ptr<const TunedTable>> cache;
    const std::lock_guard<std::mutex> lock(mutex);
    const auto cached = cache.find(path);
    if (cached != cache.end()) return cached->second;
    std::string error;
    std::shared_ptr<const TunedTable> table = read_tuned_table(path, spec, device_name, &error);
    if (table == nullptr)
      warn_once("table:" + path, "ignoring tuned table " + path + ": " + error + "; using the analytic rule");
    cache[path] = table;
    // NOTE: the first file found decides, even when it is bad: falling through to an older table in
    // a later directory would hide the warning's cause behind different, unexplained choices.
    return table;
  }
  return nullptr;
}

std::string current_device_name() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // NOTE: clear the error, so later checks of cudaGetLastError do not see it
    return "";
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  // NOTE: cudaGetDeviceProperties fills every field and costs far more than the rest of planning;
  // one query per device ordinal per process.
  static std::mutex mutex;
  static std::map<int, std::string> names;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto known = names.find(device);
  if (known != names.end()) return known->second;
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return names[device] = props.name;
}

std::shared_ptr<const PlanOverrides> make_plan_overrides(const MoeSpec& spec, const PlanOptions& options) {
  auto overrides = std::make_shared<PlanOverrides>();
  if (!options.force_variant.empty()) {
    if (spec.batch_invariant)
      throw Error("hmoe: PlanOptions.force_variant = '" + options.force_variant +
                  "' with MoeSpec.batch_invariant: batch-invariant mode runs its one fixed variant");
    overrides->forced = parse_plan_variant(options.force_variant, spec);
    return overrides;
  }
  // Batch-invariant mode never consults a table (plan_for), so it need not look for one.
  if (spec.batch_invariant) return overrides;
  overrides->tuned = find_tuned_table(spec, current_device_name());
  return overrides;
}

std::optional<Plan> overridden_plan(const PlanOverrides& overrides, int num_tokens, Orientation orientation) {
  const PlanVariant* variant = nullptr;
  std::string_view source;
  if (overrides.forced) {
    variant = &*overrides.forced;
    source = "forced";
  } else if (overrides.tuned != nullptr && orientation == Orientation::kAuto) {
    variant = &overrides.tuned->bucket_for(num_tokens).variant;
    source = overrides.tuned->source;
  } else {
    return std::nullopt;
  }
  Plan plan;
  plan.swap_ab = variant->gemm1->swap_ab;
  plan.token_tile = variant->gemm1->token_tile;
  plan.gemm1 = variant->gemm1;
  plan.gemm2 = variant->gemm2;
  plan.source = source;
  return plan;
}

}  // namespace hmoe::dispatch
