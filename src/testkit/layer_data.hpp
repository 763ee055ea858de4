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

struct LayerWeights {
  MoeSpec spec;
  DeviceBuffer w13_prepared;                     // prepared_w13_bytes(spec)
  DeviceBuffer w2_prepared;                      // prepared_w2_bytes(spec)
  DeviceBuffer correction_bias;                  // [E] fp32, grouped routing only
  std::vector<std::uint16_t> w13_host;           // [E, 2I, H] bf16, HF layout; empty without host copy
  std::vector<std::uint16_t> w2_host;            // [E, H, I] bf16
  std::vector<float> correction_bias_host;       // [E], grouped routing only

  Weights device_weights() const;
  bool has_host_copy() const { return !w13_host.empty(); }
};

// w13 ~ U(-1,1)/sqrt(H), w2 ~ U(-1,1)/sqrt(I) (so outputs stay O(1)), prepared with
// hmoe::prepare_weights. The unprepared device copies are freed before returning.
LayerWeights make_layer_weights(const MoeSpec& spec, std::uint64_t seed, bool keep_host_copy, cudaStream_t stream);

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
