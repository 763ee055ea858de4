// The reference MoE layer of DESIGN.md §2 in float64, from bf16 weights or FP8-emulated ones.
// Work runs expert by expert, split over threads by weight rows, so every weight row streams once.
#include <algorithm>
#include <cmath>
#include <functional>

#include "reference/parallel.hpp"
#include "reference/reference.hpp"

namespace hmoe::reference {
namespace {

// Tokens dotted with one weight row at once: independent accumulators the compiler vectorises,
// each summing its own token in plain column order.
constexpr int kTokenBlock = 8;
// Tokens per batch when a dynamic per-tensor scale must see every token's SwiGLU output.
constexpr int kAmaxTokenBatch = 256;

// One (sampled token, top-k slot) pair whose expert id is valid.
struct RoutedSlot {
  int sample = 0;      // index into the `tokens` list
  int expert = 0;
  double weight = 0.0;
};

// One expert's activation rows, transposed into [blocks][cols][kTokenBlock] (zero padded).
struct ExpertPanel {
  int expert = 0;
  std::vector<int> output_rows;   // slot of each panel column
  std::vector<double> panel;
};

using WeightRowLoader = std::function<void(int expert, int row, double* out)>;

std::vector<ExpertPanel> expert_panels(const std::vector<RoutedSlot>& slots,
                                       const std::vector<int>& input_rows,
                                       const std::vector<double>& inputs, int cols, int experts) {
  std::vector<std::vector<int>> slots_of_expert(experts);
  for (int s = 0; s < static_cast<int>(slots.size()); ++s) slots_of_expert[slots[s].expert].push_back(s);

  std::vector<ExpertPanel> panels;
  for (int e = 0; e < experts; ++e) {
    const std::vector<int>& members = slots_of_expert[e];
    if (members.empty()) continue;
    ExpertPanel& panel = panels.emplace_back();
    panel.expert = e;
    panel.output_rows = members;
    const std::size_t blocks = (members.size() + kTokenBlock - 1) / kTokenBlock;
    panel.panel.assign(blocks * cols * kTokenBlock, 0.0);
    for (std::size_t m = 0; m < members.size(); ++m) {
      const double* input = inputs.data() + std::size_t(input_rows[members[m]]) * cols;
      double* block = panel.panel.data() + (m / kTokenBlock) * cols * kTokenBlock;
      for (int c = 0; c < cols; ++c) block[std::size_t(c) * kTokenBlock + m % kTokenBlock] = input[c];
    }
  }
  return panels;
}

// sums[r][j] = Σ_c rows[r][c] · block[c][j] for kRows weight rows and the first kLanes token lanes
// of one panel block. Each sum runs over c in plain order, whatever kRows and kLanes are, so the
// result does not depend on how rows and lanes are grouped (the blocking only gives the compiler
// independent accumulators: 4 rows × 8 lanes fill the 16 SSE2 registers of x86-64 and measured
// 1.9× faster than 1 × 8 at T = 256 on qwen3-30b-a3b, same bits; docs/PERF.md).
template <int kRows, int kLanes>
void dot_rows_with_block(const double* const* rows, const double* block, int cols, double (*sums)[kTokenBlock]) {
  double acc[kRows][kLanes] = {};
  for (int c = 0; c < cols; ++c) {
    const double* lanes = block + std::size_t(c) * kTokenBlock;
    for (int r = 0; r < kRows; ++r) {
      const double w = rows[r][c];
      for (int j = 0; j < kLanes; ++j) acc[r][j] += w * lanes[j];
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int j = 0; j < kLanes; ++j) sums[r][j] = acc[r][j];
}

// Weight rows dotted with a panel block at once (see dot_rows_with_block).
constexpr int kRowBlock = 4;

// out[s, n] = Σ_c W[expert of slot s][n, c] · inputs[input_rows[s], c], for every slot s: [slots, N].
std::vector<double> grouped_gemm(const std::vector<RoutedSlot>& slots, const std::vector<int>& input_rows,
                                 const std::vector<double>& inputs, int cols, int weight_rows,
                                 int experts, const WeightRowLoader& load_weight_row, int threads) {
  const std::vector<ExpertPanel> panels = expert_panels(slots, input_rows, inputs, cols, experts);
  std::vector<double> out(slots.size() * weight_rows);
  // Row chunks keep one expert's panel hot in cache across several weight rows, and stay small
  // enough that every thread gets several to balance the load.
  const int rows_per_item = std::clamp(weight_rows / (4 * threads), 1, 64);
  const int items = (weight_rows + rows_per_item - 1) / rows_per_item;
  parallel_for(items, threads, [&](int item) {
    std::vector<double> row_storage(std::size_t(kRowBlock) * cols);
    const int row_begin = item * rows_per_item;
    const int row_end = std::min(weight_rows, row_begin + rows_per_item);
    for (const ExpertPanel& panel : panels) {
      for (int n = row_begin; n < row_end; n += kRowBlock) {
        // A tail of fewer than kRowBlock rows repeats its last row (those sums are dropped).
        const int row_count = std::min(kRowBlock, row_end - n);
        const double* rows[kRowBlock];
        for (int r = 0; r < kRowBlock; ++r) {
          rows[r] = row_storage.data() + std::size_t(std::min(r, row_count - 1)) * cols;
          if (r < row_count) load_weight_row(panel.expert, n + r, row_storage.data() + std::size_t(r) * cols);
        }
        for (std::size_t first = 0; first < panel.output_rows.size(); first += kTokenBlock) {
          const double* block = panel.panel.data() + first * cols;
          const std::size_t count = std::min<std::size_t>(kTokenBlock, panel.output_rows.size() - first);
          double sums[kRowBlock][kTokenBlock];
          // Panels of a few tokens (decode sizes) skip the zero-padded lanes.
          if (count <= kTokenBlock / 2)
            dot_rows_with_block<kRowBlock, kTokenBlock / 2>(rows, block, cols, sums);
          else
            dot_rows_with_block<kRowBlock, kTokenBlock>(rows, block, cols, sums);
          for (int r = 0; r < row_count; ++r)
            for (std::size_t j = 0; j < count; ++j)
              out[std::size_t(panel.output_rows[first + j]) * weight_rows + n + r] = sums[r][j];
        }
      }
    }
  });
  return out;
}

std::vector<RoutedSlot> routed_slots(const MoeSpec& spec, const Routing& routing,
                                     const std::vector<int>& tokens) {
  if (routing.ids.size() != std::size_t(routing.num_tokens) * routing.top_k ||
      routing.weights.size() != routing.ids.size())
    throw Error("hmoe::reference::moe_layer: routing holds " + std::to_string(routing.ids.size()) +
                " ids, expected num_tokens × top_k = " + std::to_string(routing.num_tokens) + " × " +
                std::to_string(routing.top_k));
  std::vector<RoutedSlot> slots;
  for (int sample = 0; sample < static_cast<int>(tokens.size()); ++sample) {
    const int token = tokens[sample];
    if (token < 0 || token >= routing.num_tokens)
      throw Error("hmoe::reference::moe_layer: tokens[" + std::to_string(sample) + "] = " +
                  std::to_string(token) + ": expected 0.." + std::to_string(routing.num_tokens - 1));
    for (int j = 0; j < routing.top_k; ++j) {
      const std::size_t index = std::size_t(token) * routing.top_k + j;
      const int expert = routing.ids[index];
      if (expert >= 0 && expert < spec.num_experts)
        slots.push_back({sample, expert, double(routing.weights[index])});
    }
  }
  return slots;
}

std::vector<double> bf16_rows(const std::uint16_t* matrix, int cols, const std::vector<int>& rows) {
  std::vector<double> values(rows.size() * cols);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (int c = 0; c < cols; ++c) values[r * cols + c] = bf16_to_float(matrix[std::size_t(rows[r]) * cols + c]);
  }
  return values;
}

// silu(W1·x) ⊙ (W3·x) for every slot, x_rows indexed by sample: [slots, I].
std::vector<double> swiglu(const MoeSpec& spec, const std::vector<RoutedSlot>& slots,
                           const std::vector<double>& x_rows, const WeightRowLoader& load_w13_row,
                           int threads) {
  const int intermediate = spec.intermediate;
  std::vector<int> samples(slots.size());
  for (std::size_t s = 0; s < slots.size(); ++s) samples[s] = slots[s].sample;
  const std::vector<double> gate_up = grouped_gemm(slots, samples, x_rows, spec.hidden, 2 * intermediate,
                                                   spec.num_experts, load_w13_row, threads);
  std::vector<double> activations(slots.size() * intermediate);
  for (std::size_t s = 0; s < slots.size(); ++s) {
    const double* gate = gate_up.data() + s * 2 * intermediate;
    const double* up = gate + intermediate;
    for (int i = 0; i < intermediate; ++i)
      activations[s * intermediate + i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  }
  return activations;
}

// Σ over a sample's slots of weight · W2·activation: [samples, H].
std::vector<double> down_and_combine(const MoeSpec& spec, const std::vector<RoutedSlot>& slots,
                                     const std::vector<double>& activations, std::size_t samples,
                                     const WeightRowLoader& load_w2_row, int threads) {
  const int hidden = spec.hidden;
  std::vector<int> own_rows(slots.size());
  for (std::size_t s = 0; s < slots.size(); ++s) own_rows[s] = static_cast<int>(s);
  const std::vector<double> down = grouped_gemm(slots, own_rows, activations, spec.intermediate, hidden,
                                                spec.num_experts, load_w2_row, threads);
  std::vector<double> out(samples * hidden, 0.0);
  for (std::size_t s = 0; s < slots.size(); ++s) {
    double* row = out.data() + std::size_t(slots[s].sample) * hidden;
    for (int h = 0; h < hidden; ++h) row[h] += slots[s].weight * down[s * hidden + h];
  }
  return out;
}

void check_fp8_layer(const MoeSpec& spec, const Fp8Layer& layer) {
  const auto check = [&](const QuantizedWeights* weights, const char* name, int rows, int cols) {
    if (weights == nullptr || weights->scheme != spec.scheme || weights->experts != spec.num_experts ||
        weights->rows != rows || weights->cols != cols)
      throw Error(std::string("hmoe::reference::moe_layer: ") + name + " must be quantised with scheme " +
                  to_string(spec.scheme) + " as [" + std::to_string(spec.num_experts) + ", " +
                  std::to_string(rows) + ", " + std::to_string(cols) + "]");
  };
  check(layer.w13, "w13", 2 * spec.intermediate, spec.hidden);
  check(layer.w2, "w2", spec.hidden, spec.intermediate);
}

// The SwiGLU output as the GPU stores it before re-quantising: rounded to bf16.
std::vector<double> rounded_to_bf16(std::vector<double> values) {
  for (double& value : values) value = bf16_to_float(float_to_bf16(static_cast<float>(value)));
  return values;
}

float amax_as_float(const std::vector<double>& values) {
  float amax = 0.0f;
  for (double value : values) amax = std::max(amax, std::fabs(static_cast<float>(value)));
  return amax;
}

}  // namespace

std::vector<double> moe_layer(const MoeSpec& spec, const Bf16Layer& layer, const Routing& routing,
                              const std::vector<int>& tokens, int threads) {
  threads = resolve_threads(threads);
  const std::vector<RoutedSlot> slots = routed_slots(spec, routing, tokens);
  const int hidden = spec.hidden, intermediate = spec.intermediate;
  const auto load_w13_row = [&](int expert, int row, double* out) {
    const std::uint16_t* source = layer.w13 + (std::size_t(expert) * 2 * intermediate + row) * hidden;
    for (int c = 0; c < hidden; ++c) out[c] = bf16_to_float(source[c]);
  };
  const auto load_w2_row = [&](int expert, int row, double* out) {
    const std::uint16_t* source = layer.w2 + (std::size_t(expert) * hidden + row) * intermediate;
    for (int c = 0; c < intermediate; ++c) out[c] = bf16_to_float(source[c]);
  };
  const std::vector<double> activations =
      swiglu(spec, slots, bf16_rows(layer.x, hidden, tokens), load_w13_row, threads);
  return down_and_combine(spec, slots, activations, tokens.size(), load_w2_row, threads);
}

std::vector<double> moe_layer(const MoeSpec& spec, const Fp8Layer& layer, const Routing& routing,
                              const std::vector<int>& tokens, int threads) {
  check_fp8_layer(spec, layer);
  threads = resolve_threads(threads);
  const QuantScheme scheme = spec.scheme;
  const bool per_tensor = scheme == QuantScheme::kPerTensor;
  const bool dynamic_per_tensor = per_tensor && !layer.options.static_act_scale;
  const int hidden = spec.hidden;

  // A per-tensor scale is fixed before any row is quantised, so sampled rows see the scale the
  // whole tensor gets on the GPU.
  Fp8Options x_options = layer.options;
  if (dynamic_per_tensor) {
    std::vector<int> all_tokens(routing.num_tokens);
    for (int t = 0; t < routing.num_tokens; ++t) all_tokens[t] = t;
    x_options.static_act_scale = true;
    x_options.act_scale = fp8_scale(amax_as_float(bf16_rows(layer.x, hidden, all_tokens)),
                                    layer.options.ue8m0_scales);
  }
  const auto quantized_x = [&](const std::vector<int>& rows) {
    const std::vector<double> values = bf16_rows(layer.x, hidden, rows);
    return fake_quantize_activations(scheme, values.data(), static_cast<int>(rows.size()), hidden, x_options);
  };
  const auto load_w13_row = [&](int expert, int row, double* out) {
    dequantize_weight_row(*layer.w13, expert, row, out);
  };
  const auto load_w2_row = [&](int expert, int row, double* out) {
    dequantize_weight_row(*layer.w2, expert, row, out);
  };

  Fp8Options intermediate_options = layer.options;
  if (per_tensor) {
    intermediate_options.static_act_scale = true;
    intermediate_options.act_scale = layer.options.intermediate_act_scale;
  }
  if (dynamic_per_tensor) {
    // NOTE: this costs GEMM1 over every token, not only the sampled ones.
    float amax = 0.0f;
    for (int first = 0; first < routing.num_tokens; first += kAmaxTokenBatch) {
      std::vector<int> batch;
      for (int t = first; t < std::min(routing.num_tokens, first + kAmaxTokenBatch); ++t) batch.push_back(t);
      const std::vector<RoutedSlot> batch_slots = routed_slots(spec, routing, batch);
      amax = std::max(amax, amax_as_float(rounded_to_bf16(swiglu(spec, batch_slots, quantized_x(batch), load_w13_row,
                                                                   threads))));
    }
    intermediate_options.act_scale = fp8_scale(amax, layer.options.ue8m0_scales);
  }

  const std::vector<RoutedSlot> slots = routed_slots(spec, routing, tokens);
  const std::vector<double> activations =
      rounded_to_bf16(swiglu(spec, slots, quantized_x(tokens), load_w13_row, threads));
  const std::vector<double> quantized_activations = fake_quantize_activations(
      scheme, activations.data(), static_cast<int>(slots.size()), spec.intermediate, intermediate_options);
  return down_and_combine(spec, slots, quantized_activations, tokens.size(), load_w2_row, threads);
}

}  // namespace hmoe::reference
