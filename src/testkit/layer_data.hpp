// One layer's worth of generated test data: weights prepared for the runner (with host copies for
// the reference) and input sets for either entry point, plus the host view the reference needs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "hmoe/hmoe.hpp"
#include "reference/reference.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/random_inputs.hpp"

namespace hmoe::testkit {

// |correction_bias| stays below this: small next to the routing levels, as in real checkpoints.
inline constexpr float kCorrectionBiasScale = 0.01f;

// Static per-tensor activation scales the fp8-tensor tests use (x ~ U(-1,1) fits 1/448 exactly; a
// smaller intermediate scale saturates its largest values, which the reference emulates too).
inline constexpr float kStaticActScale = 1.0f / 448.0f;
inline constexpr float kStaticIntermediateActScale = 0.5f / 448.0f;

struct LayerWeights {
  MoeSpec spec;
  DeviceBuffer w13_prepared;                     // prepared_w13_bytes(spec)
  DeviceBuffer w2_prepared;                      // prepared_w2_bytes(spec)
  DeviceBuffer correction_bias;                  // [E] fp32, grouped routing only
  std::vector<std::uint16_t> w13_host;           // [E, 2I, H] bf16, HF layout; empty without host copy
  std::vector<std::uint16_t> w2_host;            // [E, H, I] bf16 (FP8: the values before quantisation)
  std::vector<float> correction_bias_host;       // [E], grouped routing only
  // FP8 specs: scales (weight_scale_count floats each), the quantised weights as the reference sees
  // them (host copy only), and static activation scales when asked for.
  DeviceBuffer w13_scale;
  DeviceBuffer w2_scale;
  reference::QuantizedWeights w13_fp8_host;
  reference::QuantizedWeights w2_fp8_host;
  bool static_act_scales = false;                // fp8-tensor: RunArgs.act_scale / intermediate_act_scale
  DeviceBuffer act_scales;                       // [2]: kStaticActScale, kStaticIntermediateActScale

  Weights device_weights() const;
  bool has_host_copy() const { return !w13_host.empty(); }
  bool fp8() const { return spec.weight_dtype == WeightDType::kFP8E4M3; }
  reference::Fp8Options fp8_options() const;     // what the reference needs to emulate the run
};

// w13 ~ U(-1,1)/sqrt(H), w2 ~ U(-1,1)/sqrt(I) (so outputs stay O(1)) in bf16; FP8 specs quantise
// them with hmoe::quantize_weights. Prepared with hmoe::prepare_weights; the unprepared device
// copies are freed before returning. static_act_scales: fp8-tensor only.
LayerWeights make_layer_weights(const MoeSpec& spec, std::uint64_t seed, bool keep_host_copy, cudaStream_t stream,
                                bool static_act_scales = false);
// Switches fp8-tensor weights between dynamic activation scales and the static ones above (the
// runs then read RunArgs.act_scale / intermediate_act_scale, and fp8_options() tells the reference).
// NOTE: the GEMM kernels are the same either way: the dynamic scales come from separate amax passes.
void set_static_act_scales(LayerWeights& weights, bool static_act_scales, cudaStream_t stream);

struct LayerInputs {
  int num_tokens = 0;
  Entry entry = Entry::kLogits;
  DeviceBuffer x;              // [T, H] bf16
  DeviceBuffer router_logits;  // [T, E] in spec.routing.logits_dtype (logits entry)
  DeviceBuffer topk_ids;       // [T, k] int32 (topk entry)
  DeviceBuffer topk_weights;   // [T, k] fp32 (topk entry)
};

// Allocates the buffers for num_tokens and fills them (see fill_layer_inputs).
LayerInputs make_layer_inputs(const LayerWeights& weights, int num_tokens, Entry entry, const RoutingDraw& draw,
                              cudaStream_t stream);
// Redraws every input in place: x ~ U(-1,1), and the routing inputs of the entry point.
void fill_layer_inputs(LayerInputs& inputs, const LayerWeights& weights, const RoutingDraw& draw, cudaStream_t stream);

// RunArgs for inputs and out, without workspace.
RunArgs run_args(const LayerWeights& weights, const LayerInputs& inputs, void* out);
// Runs the entry point the inputs were made for.
void run_layer(const MoeRunner& runner, const RunArgs& args, const LayerInputs& inputs, cudaStream_t stream);

// The routing as the reference sees it: reference::route over the logits (as float) for the logits
// entry, the generated ids and weights for the topk entry.
reference::Routing host_routing(const LayerWeights& weights, const LayerInputs& inputs, cudaStream_t stream);

}  // namespace hmoe::testkit
