// FP8 e4m3 quantisation emulation for the three schemes of DESIGN.md §2, weights and activations.
// The arithmetic is the contract the GPU path must match; it is spelled out in reference.hpp.
#include <algorithm>
#include <array>
#include <cmath>

#include "reference/parallel.hpp"
#include "reference/reference.hpp"

namespace hmoe::reference {
namespace {

constexpr int kBlock = 128;  // block scheme: 128×128 weight blocks, 1×128 activation groups

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Which scale an element of a stack of [rows, cols] matrices uses: matrices are cut into
// block_rows × block_cols groups, numbered row-major within a matrix and matrix after matrix. Every
// scheme is one such cut: per-tensor (the whole matrix), per-row (1 × cols), blocks (128 × 128),
// 1 × 128 activation groups.
struct Grouping {
  int rows = 0;        // rows of one matrix
  int cols = 0;
  int block_rows = 0;
  int block_cols = 0;

  int row_groups() const { return ceil_div(rows, block_rows); }
  int col_groups() const { return ceil_div(cols, block_cols); }
  // The first group of a row; stacked_row runs over all matrices (matrix = stacked_row / rows).
  std::size_t row_start(std::size_t stacked_row) const {
    const std::size_t matrix = stacked_row / rows;
    const int row = static_cast<int>(stacked_row % rows);
    return (matrix * row_groups() + row / block_rows) * col_groups();
  }
  // Calls visit(group, first_col, end_col) for each group a row crosses, left to right.
  template <class Visit>
  void for_each_span(std::size_t stacked_row, Visit visit) const {
    const std::size_t first_group = row_start(stacked_row);
    for (int g = 0; g < col_groups(); ++g)
      visit(first_group + g, g * block_cols, std::min(cols, (g + 1) * block_cols));
  }
};

Grouping weight_grouping(QuantScheme scheme, int rows, int cols) {
  switch (scheme) {
    case QuantScheme::kPerTensor: return {rows, cols, rows, cols};
    case QuantScheme::kPerChannelPerToken: return {rows, cols, 1, cols};
    case QuantScheme::kBlock128: return {rows, cols, kBlock, kBlock};
    case QuantScheme::kNone: break;
  }
  throw Error("hmoe::reference: FP8 quantisation needs an FP8 scheme, got " + to_string(scheme));
}

// Activations [M, K] as one matrix: the whole tensor, one group per row, or 1 × 128 groups.
Grouping activation_grouping(QuantScheme scheme, int rows, int cols) {
  switch (scheme) {
    case QuantScheme::kPerTensor: return {rows, cols, rows, cols};
    case QuantScheme::kPerChannelPerToken: return {rows, cols, 1, cols};
    case QuantScheme::kBlock128: return {rows, cols, 1, kBlock};
    case QuantScheme::kNone: break;
  }
  throw Error("hmoe::reference: FP8 quantisation needs an FP8 scheme, got " + to_string(scheme));
}

// load(stacked_row, col) gives the element as float.
// Matrices run in parallel: no group spans two of them.
template <class Load>
std::vector<float> group_scales(const Grouping& grouping, std::size_t stacked_rows, Load load,
                                bool ue8m0) {
  const std::size_t matrices = stacked_rows / grouping.rows;
  std::vector<float> amax(matrices * grouping.row_groups() * grouping.col_groups(), 0.0f);
  parallel_for(static_cast<int>(matrices), 0, [&](int matrix) {
    const std::size_t first_row = std::size_t(matrix) * grouping.rows;
    for (std::size_t r = first_row; r < first_row + grouping.rows; ++r) {
      grouping.for_each_span(r, [&](std::size_t group, int first_col, int end_col) {
        for (int c = first_col; c < end_col; ++c) amax[group] = std::max(amax[group], std::fabs(load(r, c)));
      });
    }
  });
  for (float& value : amax) value = fp8_scale(value, ue8m0);
  return amax;
}

const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> values{};
    for (int bits = 0; bits < 256; ++bits) values[bits] = e4m3_to_float(static_cast<std::uint8_t>(bits));
    return values;
  }();
  return table;
}

}  // namespace

float fp8_scale(float amax, bool ue8m0) {
  if (amax == 0.0f) return 1.0f;
  const float scale = amax / kE4m3Max;
  return ue8m0 ? round_up_pow2(scale) : scale;
}

QuantizedWeights quantize_weights(QuantScheme scheme, const std::uint16_t* weights, int experts,
                                  int rows, int cols, const Fp8Options& options) {
  const Grouping grouping = weight_grouping(scheme, rows, cols);
  const std::size_t stacked_rows = std::size_t(experts) * rows;
  const auto load = [&](std::size_t r, int c) { return bf16_to_float(weights[r * cols + c]); };

  QuantizedWeights quantized;
  quantized.scheme = scheme;
  quantized.experts = experts;
  quantized.rows = rows;
  quantized.cols = cols;
  quantized.scales = group_scales(grouping, stacked_rows, load, options.ue8m0_scales);
  quantized.values.resize(stacked_rows * cols);
  parallel_for(experts, 0, [&](int expert) {
    for (std::size_t r = std::size_t(expert) * rows; r < std::size_t(expert + 1) * rows; ++r) {
      grouping.for_each_span(r, [&](std::size_t group, int first_col, int end_col) {
        const float scale = quantized.scales[group];
        for (int c = first_col; c < end_col; ++c) quantized.values[r * cols + c] = float_to_e4m3(load(r, c) / scale);
      });
    }
  });
  return quantized;
}

void dequantize_weight_row(const QuantizedWeights& weights, int expert, int row, double* out) {
  const Grouping grouping = weight_grouping(weights.scheme, weights.rows, weights.cols);
  const std::size_t stacked_row = std::size_t(expert) * weights.rows + row;
  const std::uint8_t* values = weights.values.data() + stacked_row * weights.cols;
  const std::array<float, 256>& decode = e4m3_values();
  grouping.for_each_span(stacked_row, [&](std::size_t group, int first_col, int end_col) {
    const double scale = weights.scales[group];
    for (int c = first_col; c < end_col; ++c) out[c] = double(decode[values[c]]) * scale;
  });
}

std::vector<double> fake_quantize_activations(QuantScheme scheme, const double* rows, int num_rows,
                                              int cols, const Fp8Options& options) {
  if (num_rows == 0) return {};
  const Grouping grouping = activation_grouping(scheme, num_rows, cols);
  const auto load = [&](std::size_t r, int c) { return static_cast<float>(rows[r * cols + c]); };
  const bool static_scale = scheme == QuantScheme::kPerTensor && options.static_act_scale;
  const std::vector<float> scales = static_scale
      ? std::vector<float>{options.act_scale}
      : group_scales(grouping, num_rows, load, options.ue8m0_scales);

  std::vector<double> dequantized(std::size_t(num_rows) * cols);
  const std::array<float, 256>& decode = e4m3_values();
  for (std::size_t r = 0; r < std::size_t(num_rows); ++r) {
    grouping.for_each_span(r, [&](std::size_t group, int first_col, int end_col) {
      const float scale = scales[group];
      for (int c = first_col; c < end_col; ++c)
        dequantized[r * cols + c] = double(decode[float_to_e4m3(load(r, c) / scale)]) * double(scale);
    });
  }
  return dequantized;
}

}  // namespace hmoe::reference
