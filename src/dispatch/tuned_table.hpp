// Tuned tables: per (device, E, N = I, K = H, dtype) JSON files mapping token-count buckets to the
// GEMM variant pair `hmoe tune` measured fastest (and, at T ≤ 4, whether the fused decode layer beat
// it), found at plan time and consulted by choose_plan before the analytic rule. A malformed or stale
// file is reported once and ignored. docs/DISPATCH.md describes the format and the lookup order.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch/plan.hpp"
#include "dispatch/registry.hpp"
#include "hmoe/hmoe.hpp"

namespace hmoe::dispatch {

// The environment variable naming the one directory to search (set, it replaces the defaults).
inline constexpr const char* kTunedDirEnv = "HMOE_TUNED_DIR";

struct TunedBucket {
  int num_tokens = 0;       // the T the choice was measured at
  PlanVariant variant;      // the unfused pair, also where the fused layer does not apply
  double latency_us = 0.0;  // measured by the tuner (informational)
  // "fused": the fused decode layer beat the pair here, so FusedDecode::kAuto runs it at the T this
  // bucket serves (where decode::applies). Only at num_tokens ≤ decode::kMaxTokens.
  bool fused_decode = false;
};

struct TunedTable {
  std::string path;                  // file it was read from
  std::string source;                // "tuned:<file name>", PlanInfo::source of its plans
  std::vector<TunedBucket> buckets;  // ascending num_tokens, at least one

  // The bucket nearest T on a log scale (tokens per expert scale geometrically); ties go to the
  // smaller bucket.
  const TunedBucket& bucket_for(int num_tokens) const;
};

// "bf16" today; the FP8 schemes will name theirs as serving engines do ("fp8_w8a8" + block_shape).
std::string tuned_dtype_tag(const MoeSpec& spec);
// "NVIDIA H200" → "NVIDIA_H200".
std::string tuned_device_tag(std::string_view device_name);
// "E=128,N=768,K=2048,device_name=NVIDIA_H200,dtype=bf16.json".
std::string tuned_file_name(const MoeSpec& spec, std::string_view device_name);

// Directories searched, in order: $HMOE_TUNED_DIR alone when set; else <executable dir>/../share/
// hmoe/tuned (the install tree), then the source tree's tuned/ this build was configured from.
std::vector<std::string> tuned_search_dirs();
// Where `hmoe tune` writes by default: $HMOE_TUNED_DIR when set, else the source tree's tuned/.
std::string default_tuned_dir();

// Reads and validates one file for spec on device_name. nullptr and *error set when it is
// unreadable, not JSON, for another shape/device/dtype, names a kernel this build lacks, or pairs
// kernels that cannot run together.
std::shared_ptr<const TunedTable> read_tuned_table(const std::string& path, const MoeSpec& spec,
                                                   std::string_view device_name, std::string* error);

// The table for spec on device_name from the search directories, or nullptr. Each file is read
// once per process; a bad one gets one warning on stderr and is then ignored.
std::shared_ptr<const TunedTable> find_tuned_table(const MoeSpec& spec, std::string_view device_name);

// The current CUDA device's name, or "" when there is no usable device (then no table applies).
std::string current_device_name();

// What a runner knows beyond the analytic rule: a forced variant (PlanOptions::force_variant) or
// the tuned table for its shape on this device.
struct PlanOverrides {
  std::optional<PlanVariant> forced;
  std::shared_ptr<const TunedTable> tuned;
};

// Built once in the MoeRunner constructor; throws hmoe::Error for a bad force_variant.
std::shared_ptr<const PlanOverrides> make_plan_overrides(const MoeSpec& spec, const PlanOptions& options);

// The plan the overrides dictate for T, or nothing (then the analytic rule decides). A forced variant
// always applies; a tuned table only when the caller left the orientation to hmoe (kAuto).
std::optional<Plan> overridden_plan(const PlanOverrides& overrides, int num_tokens, Orientation orientation);

}  // namespace hmoe::dispatch
