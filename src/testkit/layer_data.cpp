// Weight and input generation for one layer, and the bridge from device buffers to the reference.
#include "testkit/layer_data.hpp"

#include <cmath>

namespace hmoe::testkit {
namespace {

// Salts of the tensors drawn from one seed.
constexpr std::uint64_t kSaltW13 = 13;
constexpr std::uint64_t kSaltW2 = 2;
constexpr std::uint64_t kSaltCorrectionBias = 0xb1a5;
constexpr std::uint64_t kSaltX = 0x78;

bool is_grouped(const MoeSpec& spec) { return spec.routing.function == RoutingFunction::kGroupedSigmoidTopK; }

std::size_t logits_element_bytes(const MoeSpec& spec) {
  return spec.routing.logits_dtype == LogitsDType::kBFloat16 ? sizeof(std::uint16_t) : sizeof(float);
}

}  // namespace

Weights LayerWeights::device_weights() const {
  Weights weights;
  weights.w13 = w13_prepared.get();
  weights.w2 = w2_prepared.get();
  weights.correction_bias = correction_bias.as<const float>();
  weights.w13_scale = w13_scale.as<const float>();
  weights.w2_scale = w2_scale.as<const float>();
  return weights;
}

reference::Fp8Options LayerWeights::fp8_options() const {
  reference::Fp8Options options;
  options.ue8m0_scales = spec.ue8m0_scales;
  options.static_act_scale = static_act_scales;
  options.act_scale = kStaticActScale;
  options.intermediate_act_scale = kStaticIntermediateActScale;
  return options;
}

namespace {

// Quantises one bf16 matrix family on the device; keeps the host view the reference needs.
DeviceBuffer quantize_matrix(const MoeSpec& spec, WeightMatrix matrix, const DeviceBuffer& bf16, DeviceBuffer& scales,
                             bool keep_host_copy, reference::QuantizedWeights& host, cudaStream_t stream) {
  const std::size_t values = bf16.bytes() / sizeof(std::uint16_t);
  const std::size_t scale_count = weight_scale_count(spec, matrix);
  DeviceBuffer fp8(values);
  scales = DeviceBuffer(scale_count * sizeof(float));
  quantize_weights(spec, matrix, bf16.get(), fp8.get(), scales.as<float>(), stream);
  if (keep_host_copy) {
    host.scheme = spec.scheme;
    host.experts = spec.num_experts;
    host.rows = matrix == WeightMatrix::kW13 ? 2 * spec.intermediate : spec.hidden;
    host.cols = matrix == WeightMatrix::kW13 ? spec.hidden : spec.intermediate;
    host.values = copy_to_host<std::uint8_t>(fp8.get(), values, stream);
    host.scales = copy_to_host<float>(scales.get(), scale_count, stream);
  }
  return fp8;
}

}  // namespace

void set_static_act_scales(LayerWeights& weights, bool static_act_scales, cudaStream_t stream) {
  if (static_act_scales && weights.spec.scheme != QuantScheme::kPerTensor)
    throw Error("hmoe testkit: static activation scales exist for fp8-tensor only");
  if (static_act_scales && weights.act_scales.get() == nullptr) {
    const float scales[2] = {kStaticActScale, kStaticIntermediateActScale};
    weights.act_scales = DeviceBuffer(sizeof(scales));
    HMOE_CUDA_CHECK(cudaMemcpyAsync(weights.act_scales.get(), scales, sizeof(scales), cudaMemcpyHostToDevice, stream));
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  weights.static_act_scales = static_act_scales;
}

LayerWeights make_layer_weights(const MoeSpec& spec, std::uint64_t seed, bool keep_host_copy, cudaStream_t stream,
                                bool static_act_scales) {
  validate(spec);
  if (static_act_scales && spec.scheme != QuantScheme::kPerTensor)
    throw Error("hmoe testkit: static activation scales exist for fp8-tensor only");
  const std::size_t experts = spec.num_experts;
  const std::size_t w13_count = experts * 2 * spec.intermediate * spec.hidden;
  const std::size_t w2_count = experts * spec.hidden * spec.intermediate;

  LayerWeights weights;
  weights.spec = spec;
  {
    DeviceBuffer w13_source(w13_count * sizeof(std::uint16_t));
    DeviceBuffer w2_source(w2_count * sizeof(std::uint16_t));
    fill_uniform_bf16(w13_source.as<std::uint16_t>(), w13_count, 1.0f / std::sqrt(static_cast<float>(spec.hidden)),
                      seed, kSaltW13, stream);
    fill_uniform_bf16(w2_source.as<std::uint16_t>(), w2_count,
                      1.0f / std::sqrt(static_cast<float>(spec.intermediate)), seed, kSaltW2, stream);
    weights.w13_prepared = DeviceBuffer(prepared_w13_bytes(spec));
    weights.w2_prepared = DeviceBuffer(prepared_w2_bytes(spec));
    if (spec.weight_dtype == WeightDType::kFP8E4M3) {
      const DeviceBuffer w13_fp8 = quantize_matrix(spec, WeightMatrix::kW13, w13_source, weights.w13_scale,
                                                   keep_host_copy, weights.w13_fp8_host, stream);
      const DeviceBuffer w2_fp8 = quantize_matrix(spec, WeightMatrix::kW2, w2_source, weights.w2_scale, keep_host_copy,
                                                  weights.w2_fp8_host, stream);
      prepare_weights(spec, w13_fp8.get(), w2_fp8.get(), weights.w13_prepared.get(), weights.w2_prepared.get(), stream);
      HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));   // the fp8 sources die here
    } else {
      prepare_weights(spec, w13_source.get(), w2_source.get(), weights.w13_prepared.get(), weights.w2_prepared.get(),
                      stream);
    }
    if (keep_host_copy) {
      weights.w13_host = copy_to_host<std::uint16_t>(w13_source.get(), w13_count, stream);
      weights.w2_host = copy_to_host<std::uint16_t>(w2_source.get(), w2_count, stream);
    }
    // NOTE: the sources die at the end of this scope; preparation reads them asynchronously.
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  set_static_act_scales(weights, static_act_scales, stream);
  if (is_grouped(spec)) {
    weights.correction_bias = DeviceBuffer(experts * sizeof(float));
    fill_uniform_f32(weights.correction_bias.as<float>(), experts, kCorrectionBiasScale, seed, kSaltCorrectionBias,
                     stream);
    weights.correction_bias_host = copy_to_host<float>(weights.correction_bias.get(), experts, stream);
  }
  return weights;
}

LayerInputs make_layer_inputs(const LayerWeights& weights, int num_tokens, Entry entry, const RoutingDraw& draw,
                              cudaStream_t stream) {
  const MoeSpec& spec = weights.spec;
  const std::size_t tokens = num_tokens;
  LayerInputs inputs;
  inputs.num_tokens = num_tokens;
  inputs.entry = entry;
  inputs.x = DeviceBuffer(tokens * spec.hidden * sizeof(std::uint16_t));
  if (entry == Entry::kLogits) {
    inputs.router_logits = DeviceBuffer(tokens * spec.num_experts * logits_element_bytes(spec));
  } else {
    inputs.topk_ids = DeviceBuffer(tokens * spec.top_k * sizeof(std::int32_t));
    inputs.topk_weights = DeviceBuffer(tokens * spec.top_k * sizeof(float));
  }
  fill_layer_inputs(inputs, weights, draw, stream);
  return inputs;
}

void fill_layer_inputs(LayerInputs& inputs, const LayerWeights& weights, const RoutingDraw& draw, cudaStream_t stream) {
  const MoeSpec& spec = weights.spec;
  fill_uniform_bf16(inputs.x.as<std::uint16_t>(), static_cast<std::size_t>(inputs.num_tokens) * spec.hidden, 1.0f,
                    draw.seed, kSaltX, stream);
  if (inputs.entry == Entry::kLogits) {
    generate_router_logits(spec, inputs.num_tokens, draw, weights.correction_bias.as<const float>(),
                           inputs.router_logits.get(), stream);
  } else {
    generate_topk(spec, inputs.num_tokens, draw, inputs.topk_ids.as<std::int32_t>(), inputs.topk_weights.as<float>(),
                  stream);
  }
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

RunArgs run_args(const LayerWeights& weights, const LayerInputs& inputs, void* out) {
  RunArgs args;
  args.num_tokens = inputs.num_tokens;
  args.x = inputs.x.get();
  args.out = out;
  args.weights = weights.device_weights();
  if (weights.static_act_scales) {
    args.act_scale = weights.act_scales.as<const float>();
    args.intermediate_act_scale = weights.act_scales.as<const float>() + 1;
  }
  return args;
}

void run_layer(const MoeRunner& runner, const RunArgs& args, const LayerInputs& inputs, cudaStream_t stream) {
  if (inputs.entry == Entry::kLogits) {
    runner.run_from_logits(args, inputs.router_logits.get(), stream);
  } else {
    runner.run_from_topk(args, inputs.topk_ids.as<const std::int32_t>(), inputs.topk_weights.as<const float>(),
                         stream);
  }
}

reference::Routing host_routing(const LayerWeights& weights, const LayerInputs& inputs, cudaStream_t stream) {
  const MoeSpec& spec = weights.spec;
  const std::size_t tokens = inputs.num_tokens;
  if (inputs.entry == Entry::kTopK) {
    reference::Routing routing;
    routing.num_tokens = inputs.num_tokens;
    routing.top_k = spec.top_k;
    routing.ids = copy_to_host<std::int32_t>(inputs.topk_ids.get(), tokens * spec.top_k, stream);
    routing.weights = copy_to_host<float>(inputs.topk_weights.get(), tokens * spec.top_k, stream);
    return routing;
  }
  const std::size_t count = tokens * spec.num_experts;
  std::vector<float> logits;
  if (spec.routing.logits_dtype == LogitsDType::kBFloat16) {
    const std::vector<std::uint16_t> bits = copy_to_host<std::uint16_t>(inputs.router_logits.get(), count, stream);
    logits.reserve(count);
    for (std::uint16_t value : bits) logits.push_back(reference::bf16_to_float(value));
  } else {
    logits = copy_to_host<float>(inputs.router_logits.get(), count, stream);
  }
  const float* bias = weights.correction_bias_host.empty() ? nullptr : weights.correction_bias_host.data();
  return reference::route(spec, logits.data(), inputs.num_tokens, bias);
}

}  // namespace hmoe::testkit
