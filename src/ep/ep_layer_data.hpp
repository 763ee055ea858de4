// Test and benchmark support for the expert-parallel layer (tests/gpu/test_ep.cpp, examples/ep_moe):
// one layer's weights on the current device, whole (for the single-GPU layer the EP result must
// equal) and as this rank's shard prepared with ep_local_spec, both from one seeded bf16 source, and
// one rank's inputs. Header-only on top of hmoe_testkit; not part of hmoe_ep.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "hmoe/ep.hpp"
#include "hmoe/hmoe.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/layer_data.hpp"
#include "testkit/random_inputs.hpp"

namespace hmoe::ep {

struct EpLayerWeights {
  MoeSpec spec;
  ExpertShard shard;
  testkit::DeviceBuffer w13, w2;               // the whole layer, prepared with spec
  testkit::DeviceBuffer local_w13, local_w2;   // this rank's experts, prepared with ep_local_spec
  testkit::DeviceBuffer w13_scale, w2_scale;   // FP8: the whole layer's scales; the shard's are a slice
  testkit::DeviceBuffer correction_bias;       // [E] fp32, grouped routing only

  Weights whole() const {
    Weights weights;
    weights.w13 = w13.get();
    weights.w2 = w2.get();
    weights.correction_bias = correction_bias.as<const float>();
    weights.w13_scale = w13_scale.as<const float>();
    weights.w2_scale = w2_scale.as<const float>();
    return weights;
  }
  // What EpRunArgs::weights takes: the shard, and the global correction bias.
  Weights local() const {
    Weights weights = whole();
    weights.w13 = local_w13.get();
    weights.w2 = local_w2.get();
    if (spec.weight_dtype == WeightDType::kFP8E4M3) {
      weights.w13_scale += shard.first_expert * (weight_scale_count(spec, WeightMatrix::kW13) / spec.num_experts);
      weights.w2_scale += shard.first_expert * (weight_scale_count(spec, WeightMatrix::kW2) / spec.num_experts);
    }
    return weights;
  }
};

// w13 ~ U(-1,1)/sqrt(H), w2 ~ U(-1,1)/sqrt(I) in bf16 (FP8 specs: quantised with hmoe::quantize_weights),
// the same on every rank for the same seed.
inline EpLayerWeights make_ep_layer_weights(const MoeSpec& spec, int rank, int world_size, std::uint64_t seed,
                                            cudaStream_t stream) {
  constexpr std::uint64_t kSaltW13 = 13, kSaltW2 = 2, kSaltCorrectionBias = 0xb1a5;
  EpLayerWeights weights;
  weights.spec = spec;
  weights.shard = expert_shard(spec.num_experts, rank, world_size);
  const MoeSpec local_spec = ep_local_spec(spec, world_size);
  const std::size_t w13_count = static_cast<std::size_t>(spec.num_experts) * 2 * spec.intermediate * spec.hidden;
  const std::size_t w2_count = static_cast<std::size_t>(spec.num_experts) * spec.hidden * spec.intermediate;
  testkit::DeviceBuffer w13_bf16(w13_count * 2), w2_bf16(w2_count * 2);
  testkit::fill_uniform_bf16(w13_bf16.as<std::uint16_t>(), w13_count, 1.0f / std::sqrt(float(spec.hidden)), seed,
                             kSaltW13, stream);
  testkit::fill_uniform_bf16(w2_bf16.as<std::uint16_t>(), w2_count, 1.0f / std::sqrt(float(spec.intermediate)), seed,
                             kSaltW2, stream);
  const bool fp8 = spec.weight_dtype == WeightDType::kFP8E4M3;
  testkit::DeviceBuffer w13_fp8, w2_fp8;
  if (fp8) {
    w13_fp8 = testkit::DeviceBuffer(w13_count);
    w2_fp8 = testkit::DeviceBuffer(w2_count);
    weights.w13_scale = testkit::DeviceBuffer(weight_scale_count(spec, WeightMatrix::kW13) * sizeof(float));
    weights.w2_scale = testkit::DeviceBuffer(weight_scale_count(spec, WeightMatrix::kW2) * sizeof(float));
    quantize_weights(spec, WeightMatrix::kW13, w13_bf16.get(), w13_fp8.get(), weights.w13_scale.as<float>(), stream);
    quantize_weights(spec, WeightMatrix::kW2, w2_bf16.get(), w2_fp8.get(), weights.w2_scale.as<float>(), stream);
  }
  const auto* w13_source = (fp8 ? w13_fp8 : w13_bf16).as<const std::uint8_t>();
  const auto* w2_source = (fp8 ? w2_fp8 : w2_bf16).as<const std::uint8_t>();
  const std::size_t element_bytes = fp8 ? 1 : 2;
  weights.w13 = testkit::DeviceBuffer(prepared_w13_bytes(spec));
  weights.w2 = testkit::DeviceBuffer(prepared_w2_bytes(spec));
  prepare_weights(spec, w13_source, w2_source, weights.w13.get(), weights.w2.get(), stream);
  // The shard is the HF-layout source from its first expert on (E is the leading dimension).
  const std::size_t first = weights.shard.first_expert;
  weights.local_w13 = testkit::DeviceBuffer(prepared_w13_bytes(local_spec));
  weights.local_w2 = testkit::DeviceBuffer(prepared_w2_bytes(local_spec));
  prepare_weights(local_spec, w13_source + first * 2 * spec.intermediate * spec.hidden * element_bytes,
                  w2_source + first * spec.hidden * spec.intermediate * element_bytes, weights.local_w13.get(),
                  weights.local_w2.get(), stream);
  if (spec.routing.function == RoutingFunction::kGroupedSigmoidTopK) {
    weights.correction_bias = testkit::DeviceBuffer(spec.num_experts * sizeof(float));
    testkit::fill_uniform_f32(weights.correction_bias.as<float>(), spec.num_experts, testkit::kCorrectionBiasScale,
                              seed, kSaltCorrectionBias, stream);
  }
  // NOTE: the sources die at the end of this scope; preparation reads them asynchronously.
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return weights;
}

// One rank's inputs for either entry point: x ~ U(-1,1), top-k ids and weights, router logits.
struct EpInputs {
  int num_tokens = 0;
  testkit::DeviceBuffer x;             // [T, H] bf16
  testkit::DeviceBuffer topk_ids;      // [T, k] int32
  testkit::DeviceBuffer topk_weights;  // [T, k] fp32
  testkit::DeviceBuffer logits;        // [T, E] in spec.routing.logits_dtype
};

inline EpInputs make_ep_inputs(const EpLayerWeights& weights, int num_tokens, testkit::RoutingMode mode,
                               std::uint64_t seed, cudaStream_t stream) {
  constexpr std::uint64_t kSaltX = 0x78;
  const MoeSpec& spec = weights.spec;
  const std::size_t tokens = num_tokens;
  EpInputs inputs;
  inputs.num_tokens = num_tokens;
  inputs.x = testkit::DeviceBuffer(tokens * spec.hidden * 2);
  inputs.topk_ids = testkit::DeviceBuffer(tokens * spec.top_k * 4);
  inputs.topk_weights = testkit::DeviceBuffer(tokens * spec.top_k * 4);
  const std::size_t logit_bytes = spec.routing.logits_dtype == LogitsDType::kBFloat16 ? 2 : 4;
  inputs.logits = testkit::DeviceBuffer(tokens * spec.num_experts * logit_bytes);
  if (num_tokens == 0) return inputs;
  testkit::fill_uniform_bf16(inputs.x.as<std::uint16_t>(), tokens * spec.hidden, 1.0f, seed, kSaltX, stream);
  const testkit::RoutingDraw draw{mode, 1, seed};
  testkit::generate_topk(spec, num_tokens, draw, inputs.topk_ids.as<std::int32_t>(), inputs.topk_weights.as<float>(),
                         stream);
  testkit::generate_router_logits(spec, num_tokens, draw, weights.correction_bias.as<const float>(),
                                  inputs.logits.get(), stream);
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return inputs;
}

}  // namespace hmoe::ep
