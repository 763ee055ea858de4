// The C interface: converts between the plain structs of hmoe.h and the C++ API, and turns
// exceptions into status codes with a per-thread message.
#include "hmoe/hmoe.h"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "hmoe/hmoe.hpp"

struct hmoe_runner {
  hmoe::MoeRunner runner;
};

namespace {

thread_local std::string last_error;

// field names the C struct member or argument ("hmoe_spec.scheme", "matrix").
template <typename Enum>
Enum checked_enum(int value, int count, const char* field) {
  if (value < 0 || value >= count)
    throw hmoe::Error(std::string("hmoe: invalid ") + field + " = " + std::to_string(value) + ": expected 0.." +
                      std::to_string(count - 1));
  return static_cast<Enum>(value);
}

// Copies value with its NUL into a hmoe_plan_info field; a value that would not fit is an internal
// error, never a silently cut string.
template <std::size_t kSize>
void copy_string(const std::string& value, char (&field)[kSize], const char* name) {
  if (value.size() >= kSize)
    throw std::logic_error(std::string("hmoe: hmoe_plan_info.") + name + " cannot hold \"" + value + "\"");
  std::memcpy(field, value.c_str(), value.size() + 1);
}

hmoe::MoeSpec to_cpp(const hmoe_spec& spec) {
  hmoe::MoeSpec out;
  out.num_experts = spec.num_experts;
  out.top_k = spec.top_k;
  out.hidden = spec.hidden;
  out.intermediate = spec.intermediate;
  out.weight_dtype = checked_enum<hmoe::WeightDType>(spec.weight_dtype, 2, "hmoe_spec.weight_dtype");
  out.scheme = checked_enum<hmoe::QuantScheme>(spec.scheme, 4, "hmoe_spec.scheme");
  out.routing.function = checked_enum<hmoe::RoutingFunction>(spec.routing_function, 2,
                                                                "hmoe_spec.routing_function");
  out.routing.renormalize = spec.renormalize != 0;
  out.routing.num_groups = spec.num_groups;
  out.routing.topk_groups = spec.topk_groups;
  out.routing.routed_scaling_factor = spec.routed_scaling_factor;
  out.routing.logits_dtype = checked_enum<hmoe::LogitsDType>(spec.logits_dtype, 2, "hmoe_spec.logits_dtype");
  out.batch_invariant = spec.batch_invariant != 0;
  out.ue8m0_scales = spec.ue8m0_scales != 0;
  return out;
}

hmoe_spec to_c(const hmoe::MoeSpec& spec) {
  hmoe_spec out{};
  out.num_experts = spec.num_experts;
  out.top_k = spec.top_k;
  out.hidden = spec.hidden;
  out.intermediate = spec.intermediate;
  out.weight_dtype = static_cast<int>(spec.weight_dtype);
  out.scheme = static_cast<int>(spec.scheme);
  out.routing_function = static_cast<int>(spec.routing.function);
  out.renormalize = spec.routing.renormalize ? 1 : 0;
  out.num_groups = spec.routing.num_groups;
  out.topk_groups = spec.routing.topk_groups;
  out.routed_scaling_factor = spec.routing.routed_scaling_factor;
  out.logits_dtype = static_cast<int>(spec.routing.logits_dtype);
  out.batch_invariant = spec.batch_invariant ? 1 : 0;
  out.ue8m0_scales = spec.ue8m0_scales ? 1 : 0;
  return out;
}

hmoe::RunArgs to_cpp(const hmoe_run_args& args) {
  hmoe::RunArgs out;
  out.num_tokens = args.num_tokens;
  out.x = args.x;
  out.out = args.out;
  out.weights.w13 = args.w13;
  out.weights.w2 = args.w2;
  out.weights.correction_bias = args.correction_bias;
  out.weights.w13_scale = args.w13_scale;
  out.weights.w2_scale = args.w2_scale;
  out.workspace = args.workspace;
  out.workspace_size = args.workspace_size;
  out.invalid_id_count = args.invalid_id_count;
  out.act_scale = args.act_scale;
  out.intermediate_act_scale = args.intermediate_act_scale;
  return out;
}

void require(const void* pointer, const char* name) {
  if (pointer == nullptr) throw hmoe::Error(std::string("hmoe: ") + name + " is null");
}

// Runs body, mapping exceptions to status codes. CUDA failures' messages start with "hmoe: CUDA error".
template <typename Body>
hmoe_status guarded(Body&& body) {
  try {
    body();
    last_error.clear();
    return HMOE_OK;
  } catch (const hmoe::Error& error) {
    last_error = error.what();
    // NOTE: a prefix test, not a search: messages quote caller strings (a preset name may say anything).
    return last_error.rfind("hmoe: CUDA error", 0) == 0 ? HMOE_CUDA_ERROR : HMOE_INVALID_ARGUMENT;
  } catch (const std::exception& error) {
    last_error = error.what();
    return HMOE_INTERNAL_ERROR;
  }
}

}  // namespace

extern "C" {

const char* hmoe_last_error(void) { return last_error.c_str(); }

hmoe_status hmoe_spec_preset(const char* name, hmoe_spec* spec) {
  return guarded([&] {
    require(name, "name");
    require(spec, "spec");
    *spec = to_c(hmoe::preset(name));
  });
}

hmoe_status hmoe_prepared_weight_bytes(const hmoe_spec* spec, size_t* w13_bytes, size_t* w2_bytes) {
  return guarded([&] {
    require(spec, "spec");
    require(w13_bytes, "w13_bytes");
    require(w2_bytes, "w2_bytes");
    const hmoe::MoeSpec cpp = to_cpp(*spec);
    *w13_bytes = hmoe::prepared_w13_bytes(cpp);
    *w2_bytes = hmoe::prepared_w2_bytes(cpp);
  });
}

hmoe_status hmoe_prepare_weights(const hmoe_spec* spec, const void* w13_src, const void* w2_src, void* w13_dst,
                                 void* w2_dst, void* stream) {
  return guarded([&] {
    require(spec, "spec");
    hmoe::prepare_weights(to_cpp(*spec), w13_src, w2_src, w13_dst, w2_dst, static_cast<cudaStream_t>(stream));
  });
}

hmoe_status hmoe_weight_scale_count(const hmoe_spec* spec, int matrix, size_t* count) {
  return guarded([&] {
    require(spec, "spec");
    require(count, "count");
    *count = hmoe::weight_scale_count(to_cpp(*spec), checked_enum<hmoe::WeightMatrix>(matrix, 2, "matrix"));
  });
}

hmoe_status hmoe_quantize_weights(const hmoe_spec* spec, int matrix, const void* bf16_weights, void* fp8_weights,
                                  float* scales, void* stream) {
  return guarded([&] {
    require(spec, "spec");
    hmoe::quantize_weights(to_cpp(*spec), checked_enum<hmoe::WeightMatrix>(matrix, 2, "matrix"), bf16_weights,
                           fp8_weights, scales, static_cast<cudaStream_t>(stream));
  });
}

hmoe_status hmoe_runner_create_with_options(const hmoe_spec* spec, const hmoe_plan_options* options,
                                            hmoe_runner** runner) {
  return guarded([&] {
    require(spec, "spec");
    require(options, "options");
    require(runner, "runner");
    *runner = nullptr;
    hmoe::PlanOptions cpp;
    cpp.max_tokens = options->max_tokens;
    if (options->orientation < 0 || options->orientation > 2)
      throw hmoe::Error("hmoe: invalid hmoe_plan_options.orientation = " + std::to_string(options->orientation) +
                        ": expected 0 (auto), 1 (normal) or 2 (swap)");
    cpp.orientation = static_cast<hmoe::Orientation>(options->orientation);
    cpp.max_workspace_bytes = options->max_workspace_bytes;
    if (options->replay_graphs != 0 && options->replay_graphs != 1)
      throw hmoe::Error("hmoe: invalid hmoe_plan_options.replay_graphs = " + std::to_string(options->replay_graphs) +
                        ": expected 0 or 1");
    if (options->no_warm_up != 0 && options->no_warm_up != 1)
      throw hmoe::Error("hmoe: invalid hmoe_plan_options.no_warm_up = " + std::to_string(options->no_warm_up) +
                        ": expected 0 or 1");
    if (options->fused_decode < 0 || options->fused_decode > 2)
      throw hmoe::Error("hmoe: invalid hmoe_plan_options.fused_decode = " + std::to_string(options->fused_decode) +
                        ": expected 0 (auto), 1 (on) or 2 (off)");
    cpp.replay_graphs = options->replay_graphs == 1;
    cpp.warm_up = options->no_warm_up == 0;
    cpp.fused_decode = static_cast<hmoe::FusedDecode>(options->fused_decode);   // same values (hmoe.hpp)
    *runner = new hmoe_runner{hmoe::MoeRunner(to_cpp(*spec), cpp)};
  });
}

hmoe_status hmoe_runner_create(const hmoe_spec* spec, int max_tokens, int orientation, hmoe_runner** runner) {
  const hmoe_plan_options options{max_tokens, orientation, 0, 0, 0};
  return hmoe_runner_create_with_options(spec, &options, runner);
}

void hmoe_runner_destroy(hmoe_runner* runner) { delete runner; }

hmoe_status hmoe_runner_workspace_bytes(const hmoe_runner* runner, size_t* bytes) {
  return guarded([&] {
    require(runner, "runner");
    require(bytes, "bytes");
    *bytes = runner->runner.workspace_bytes();
  });
}

hmoe_status hmoe_runner_plan_info(const hmoe_runner* runner, int num_tokens, hmoe_plan_info* info) {
  return guarded([&] {
    require(runner, "runner");
    require(info, "info");
    if (num_tokens < 1)
      throw hmoe::Error("hmoe: invalid num_tokens = " + std::to_string(num_tokens) + ": expected 1 or more");
    const hmoe::PlanInfo plan = runner->runner.plan_info(num_tokens);
    hmoe_plan_info out{};
    out.orientation = static_cast<int>(plan.orientation);
    out.token_tile = plan.token_tile;
    out.weight_tile = plan.weight_tile;
    out.num_chunks = plan.num_chunks;
    out.gemm1_splits = plan.gemm1_splits;
    out.gemm2_splits = plan.gemm2_splits;
    out.fused_decode = plan.fused_decode ? 1 : 0;
    copy_string(plan.gemm1_kernel, out.gemm1_kernel, "gemm1_kernel");
    copy_string(plan.gemm2_kernel, out.gemm2_kernel, "gemm2_kernel");
    copy_string(plan.source, out.source, "source");
    *info = out;
  });
}

hmoe_status hmoe_run_from_logits(const hmoe_runner* runner, const hmoe_run_args* args, const void* router_logits,
                                 void* stream) {
  return guarded([&] {
    require(runner, "runner");
    require(args, "args");
    runner->runner.run_from_logits(to_cpp(*args), router_logits, static_cast<cudaStream_t>(stream));
  });
}

hmoe_status hmoe_run_from_topk(const hmoe_runner* runner, const hmoe_run_args* args, const int32_t* topk_ids,
                               const float* topk_weights, void* stream) {
  return guarded([&] {
    require(runner, "runner");
    require(args, "args");
    runner->runner.run_from_topk(to_cpp(*args), topk_ids, topk_weights, static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
