// libFuzzer target for hmoe's host-side validation (issue 7): builds MoeSpec, PlanOptions and
// RunArgs (C++ and C API) from the fuzz bytes and calls validate, the runner, plan_info and the run
// entry points with fake device pointers. The contract it enforces: every call either throws
// hmoe::Error (C API: returns HMOE_INVALID_ARGUMENT with a message) or returns without touching
// the device. A run is only ever given T = 0 or at least one argument that must be rejected, so a
// call that returns for T > 0, or that reaches the CUDA runtime ("hmoe: CUDA error"), is a validation
// gap and aborts the fuzzer.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <string>

#include "hmoe/hmoe.h"
#include "hmoe/hmoe.hpp"

namespace {

// Reads values from the fuzz input; once it is exhausted every read returns zero.
class FuzzInput {
 public:
  FuzzInput(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  template <typename T>
  T raw() {
    T value{};
    const std::size_t count = std::min(sizeof(T), size_ - offset_);
    std::memcpy(&value, data_ + offset_, count);
    offset_ += count;
    return value;
  }
  std::uint8_t byte() { return raw<std::uint8_t>(); }
  bool flag() { return (byte() & 1) != 0; }
  // One of `choices` most of the time (values near the limits reach deeper checks), else raw bits
  // (so T must be a plain value type).
  template <typename T, std::size_t N>
  T pick(const T (&choices)[N]) {
    const std::uint8_t selector = byte();
    return selector < 200 ? choices[selector % N] : raw<T>();
  }
  std::string text(std::size_t max_length) {
    std::string result;
    const std::size_t length = std::min<std::size_t>(byte(), max_length);
    for (std::size_t i = 0; i < length && offset_ < size_; ++i) result.push_back(static_cast<char>(byte()));
    return result;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t offset_ = 0;
};

[[noreturn]] void validation_gap(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_validation: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_message(const std::string& message) {
  // HMOE_CUDA_CHECK's messages start so (common/cuda_check.hpp); others may quote fuzzed text.
  if (message.rfind("hmoe: CUDA error", 0) == 0) validation_gap("a call reached the CUDA runtime", message);
  if (message.rfind("hmoe", 0) != 0) validation_gap("an error message without the hmoe prefix", message);
}

// Runs call; a thrown hmoe::Error must carry a proper message, and when must_throw a normal return
// is a gap (the call would have launched kernels).
template <typename Call>
void expect_rejected_or_noop(bool must_throw, const char* what, Call&& call) {
  try {
    call();
  } catch (const hmoe::Error& error) {
    check_message(error.what());
    return;
  }
  if (must_throw) validation_gap("accepted a run with T > 0 and an invalid argument", what);
}

void expect_c_status(hmoe_status status, bool must_fail, const char* what) {
  if (status == HMOE_OK) {
    if (must_fail) validation_gap("C API accepted a run with T > 0 and an invalid argument", what);
    return;
  }
  const std::string message = hmoe_last_error();
  if (status != HMOE_INVALID_ARGUMENT) validation_gap("C API returned a status other than INVALID_ARGUMENT", message);
  if (message.empty()) validation_gap("C API failed without a message", what);
  check_message(message);
}

// Fake device addresses: buffers 256 MiB apart, plus offsets that break alignment or overlap.
const void* fake_pointer(FuzzInput& in) {
  static const std::uintptr_t kOffsets[] = {0, 0, 0, 1, 2, 4, 8, 64, 256, 4096, 1 << 20};
  const std::uint8_t slot = in.byte() % 12;
  if (slot == 0) return nullptr;
  return reinterpret_cast<const void*>((static_cast<std::uintptr_t>(slot) << 28) + in.pick(kOffsets));
}

// The argument a run is given that must be rejected (or T = 0, which must be a no-op).
enum class Sabotage { kZeroTokens, kNullWorkspace, kSmallWorkspace, kTokensOutOfRange, kNullRoutingInput,
                      kNullX, kMisalignedOut, kCount };

hmoe::MoeSpec fuzz_spec(FuzzInput& in) {
  static const int kExperts[] = {1, 2, 8, 64, 128, 256, 1024, 1025, 0, -1};
  static const int kTopK[] = {1, 2, 8, 32, 33, 0, -5};
  static const int kDims[] = {64, 128, 2048, 7168, 65536, 65600, 100, 0, -64};
  static const int kGroups[] = {1, 2, 4, 8, 32, 33, 0};
  static const float kScale[] = {1.0f, 2.5f, 0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::quiet_NaN()};
  hmoe::MoeSpec spec;
  spec.num_experts = in.pick(kExperts);
  spec.top_k = in.pick(kTopK);
  spec.hidden = in.pick(kDims);
  spec.intermediate = in.pick(kDims);
  spec.weight_dtype = static_cast<hmoe::WeightDType>(in.byte() % 4 == 3 ? in.raw<int>() : in.byte() % 2);
  spec.scheme = static_cast<hmoe::QuantScheme>(in.byte() % 8 == 7 ? in.raw<int>() : in.byte() % 4);
  spec.routing.function = static_cast<hmoe::RoutingFunction>(in.byte() % 8 == 7 ? in.raw<int>() : in.byte() % 2);
  spec.routing.renormalize = in.flag();
  spec.routing.num_groups = in.pick(kGroups);
  spec.routing.topk_groups = in.pick(kGroups);
  spec.routing.routed_scaling_factor = in.pick(kScale);
  spec.routing.logits_dtype = static_cast<hmoe::LogitsDType>(in.byte() % 8 == 7 ? in.raw<int>() : in.byte() % 2);
  spec.batch_invariant = in.flag();
  return spec;
}

void fuzz_cpp_runner(FuzzInput& in, const hmoe::MoeSpec& spec) {
  static const int kMaxTokens[] = {1, 16, 64, 1000, 1 << 20, (1 << 20) + 1, 0, -1};
  static const std::size_t kCaps[] = {0, 0, 1, 4096, std::size_t{1} << 20, std::size_t{256} << 20,
                                      std::numeric_limits<std::size_t>::max()};
  hmoe::PlanOptions options;
  options.max_tokens = in.pick(kMaxTokens);
  options.orientation = static_cast<hmoe::Orientation>(in.byte() % 8 == 7 ? in.raw<int>() : in.byte() % 3);
  options.max_workspace_bytes = in.pick(kCaps);
  static const char* const kVariants[] = {"", "", "", "swiglu_normal_t64_w128+weighted_normal_t64_w128",
                                          "swiglu_swap_t8_w64+weighted_swap_t8_w64", "weighted_swap_t8_w64+",
                                          "+", "swiglu_normal_t64_w128", "nonsense+nonsense"};
  const std::uint8_t variant = in.byte();
  options.force_variant = variant < 240 ? std::string(kVariants[variant % std::size(kVariants)]) : in.text(80);
  std::optional<hmoe::MoeRunner> runner;
  try {
    runner.emplace(spec, options);
  } catch (const hmoe::Error& error) {
    check_message(error.what());
    return;
  }

  if (runner->workspace_bytes() == 0) validation_gap("a runner with an empty workspace", "");
  if (options.max_workspace_bytes != 0 && runner->workspace_bytes() > options.max_workspace_bytes)
    validation_gap("workspace_bytes() exceeds max_workspace_bytes", std::to_string(runner->workspace_bytes()));
  expect_rejected_or_noop(false, "plan_info", [&] { runner->plan_info(in.raw<int>()); });

  for (int round = 0; round < 4; ++round) {
    hmoe::RunArgs args;
    args.num_tokens = 1 + static_cast<int>(in.raw<std::uint32_t>() % static_cast<std::uint32_t>(options.max_tokens));
    args.x = fake_pointer(in);
    args.out = const_cast<void*>(fake_pointer(in));
    args.weights.w13 = fake_pointer(in);
    args.weights.w2 = fake_pointer(in);
    args.weights.correction_bias = static_cast<const float*>(fake_pointer(in));
    args.invalid_id_count = static_cast<int*>(const_cast<void*>(fake_pointer(in)));
    args.workspace = const_cast<void*>(fake_pointer(in));
    args.workspace_size = in.flag() ? runner->workspace_bytes() + in.byte() : in.raw<std::size_t>();
    const void* logits = fake_pointer(in);
    const auto* ids = static_cast<const std::int32_t*>(fake_pointer(in));
    const auto* weights = static_cast<const float*>(fake_pointer(in));
    const bool from_logits = in.flag();
    switch (static_cast<Sabotage>(in.byte() % static_cast<int>(Sabotage::kCount))) {
      case Sabotage::kZeroTokens: args.num_tokens = 0; break;
      case Sabotage::kNullWorkspace: args.workspace = nullptr; break;
      case Sabotage::kSmallWorkspace: args.workspace_size = runner->workspace_bytes() - 1 - in.byte(); break;
      case Sabotage::kTokensOutOfRange:
        args.num_tokens = in.flag() ? options.max_tokens + 1 + in.byte() : -1 - in.byte();
        break;
      case Sabotage::kNullRoutingInput:
        if (from_logits) logits = nullptr; else if (in.flag()) ids = nullptr; else weights = nullptr;
        break;
      case Sabotage::kNullX: args.x = nullptr; break;
      case Sabotage::kMisalignedOut: {
        // 2 bytes past a 16-byte boundary, whatever alignment the fuzzed pointer had.
        const std::uintptr_t base = args.out != nullptr ? reinterpret_cast<std::uintptr_t>(args.out) : 0x20000000;
        args.out = reinterpret_cast<void*>((base & ~std::uintptr_t{15}) + 2);
        break;
      }
      case Sabotage::kCount: break;
    }
    const bool must_throw = args.num_tokens != 0;
    if (from_logits)
      expect_rejected_or_noop(must_throw, "run_from_logits", [&] { runner->run_from_logits(args, logits, nullptr); });
    else
      expect_rejected_or_noop(must_throw, "run_from_topk", [&] { runner->run_from_topk(args, ids, weights, nullptr); });
  }
}

void fuzz_c_api(FuzzInput& in, const hmoe::MoeSpec& cpp) {
  hmoe_spec spec{};
  spec.num_experts = cpp.num_experts;
  spec.top_k = cpp.top_k;
  spec.hidden = cpp.hidden;
  spec.intermediate = cpp.intermediate;
  spec.weight_dtype = static_cast<int>(cpp.weight_dtype);
  spec.scheme = static_cast<int>(cpp.scheme);
  spec.routing_function = in.flag() ? in.raw<int>() : static_cast<int>(cpp.routing.function);
  spec.renormalize = in.raw<int>();
  spec.num_groups = cpp.routing.num_groups;
  spec.topk_groups = cpp.routing.topk_groups;
  spec.routed_scaling_factor = cpp.routing.routed_scaling_factor;
  spec.logits_dtype = in.flag() ? in.raw<int>() : static_cast<int>(cpp.routing.logits_dtype);

  std::size_t w13_bytes = 0, w2_bytes = 0;
  expect_c_status(hmoe_prepared_weight_bytes(&spec, &w13_bytes, &w2_bytes), false, "prepared_weight_bytes");
  expect_c_status(hmoe_prepared_weight_bytes(in.flag() ? &spec : nullptr, nullptr, &w2_bytes), true,
                  "prepared_weight_bytes(null)");
  // prepare_weights with at least one null pointer must be rejected before its launch.
  const void* sources[4] = {fake_pointer(in), fake_pointer(in), fake_pointer(in), fake_pointer(in)};
  sources[in.byte() % 4] = nullptr;
  expect_c_status(hmoe_prepare_weights(&spec, sources[0], sources[1], const_cast<void*>(sources[2]),
                                       const_cast<void*>(sources[3]), nullptr),
                  true, "prepare_weights(null)");

  hmoe_runner* runner = nullptr;
  const int max_tokens = in.flag() ? in.raw<int>() : 1 + in.byte();
  const hmoe_status created = hmoe_runner_create(&spec, max_tokens, in.flag() ? in.raw<int>() : in.byte() % 3, &runner);
  expect_c_status(created, false, "runner_create");
  if (created != HMOE_OK) {
    if (runner != nullptr) validation_gap("C API left a runner behind a failed create", hmoe_last_error());
    return;
  }
  std::size_t workspace_bytes = 0;
  expect_c_status(hmoe_runner_workspace_bytes(runner, &workspace_bytes), false, "workspace_bytes");
  hmoe_run_args args{};
  args.num_tokens = in.flag() ? 0 : 1 + in.byte() % max_tokens;
  args.x = fake_pointer(in);
  args.out = const_cast<void*>(fake_pointer(in));
  args.w13 = fake_pointer(in);
  args.w2 = fake_pointer(in);
  args.correction_bias = static_cast<const float*>(fake_pointer(in));
  args.workspace = in.flag() ? nullptr : const_cast<void*>(fake_pointer(in));
  args.workspace_size = workspace_bytes;
  if (args.workspace != nullptr && args.num_tokens != 0) args.workspace_size = workspace_bytes - 1;  // must fail
  const bool must_fail = args.num_tokens != 0;
  if (in.flag()) {
    expect_c_status(hmoe_run_from_logits(runner, &args, fake_pointer(in), nullptr), must_fail, "C run_from_logits");
  } else {
    expect_c_status(hmoe_run_from_topk(runner, in.flag() ? &args : nullptr, static_cast<const int32_t*>(fake_pointer(in)),
                                       static_cast<const float*>(fake_pointer(in)), nullptr),
                    must_fail, "C run_from_topk");
  }
  hmoe_runner_destroy(runner);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  const std::string name = in.text(32);
  expect_rejected_or_noop(false, "preset", [&] { hmoe::preset(name); });
  hmoe_spec preset_spec{};
  expect_c_status(hmoe_spec_preset(name.c_str(), &preset_spec), false, "spec_preset");

  hmoe::MoeSpec spec = fuzz_spec(in);
  if (in.byte() % 4 == 0) {
    // Start from a preset now and then so that valid specs reach the runner often.
    static const char* const kPresets[] = {"qwen3-30b-a3b", "deepseek-v3-tp8", "mixtral-8x7b", "olmoe-1b-7b"};
    spec = hmoe::preset(kPresets[in.byte() % 4]);
    spec.batch_invariant = in.flag();
  }
  expect_rejected_or_noop(false, "validate", [&] { hmoe::validate(spec); });
  fuzz_cpp_runner(in, spec);
  fuzz_c_api(in, spec);
  return 0;
}
