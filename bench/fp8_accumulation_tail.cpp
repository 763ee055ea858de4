// CPU experiment (docs/FP8.md, "Accuracy on tiny layers"): how far can a correct FP8 layer land from
// the quantisation-emulating float64 reference when the only difference is how the e4m3 products
// are summed? Layer: fp8-channel with UE8M0 scales, T = 2 tokens, k = 1, H = 320, I = 384, one
// random expert per token (the differential test's case that measured 2.01e-2 on the H200).
// "GPU-like" sums each 32-wide K step exactly, keeps the running 128-K block sum to `bits`
// significant bits (Hopper's e4m3 wgmma accumulator keeps about 14), and promotes every block into
// an fp32 total — the scheme src/gemm uses. Everything else (scales, e4m3 and bf16 rounding) is the
// reference's own code. Prints the distribution of ‖gpu_like − ref‖ / ‖ref‖ over random draws.
// Optional H, I and T give another layer shape (a preset's, to ask what a longer promotion
// interval would cost there: docs/PERF.md, twenty-third session).
//
//   build/fp8_accumulation_tail [draws=1000] [bits=14] [block=128] [H=320] [I=384] [T=2]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "reference/reference.hpp"

namespace {

using namespace hmoe::reference;

struct Quantized {
  std::vector<float> values;  // e4m3 values as floats
  std::vector<float> scales;  // one UE8M0 scale per row
};

float to_bf16(double value) { return bf16_to_float(float_to_bf16(static_cast<float>(value))); }

Quantized quantize_rows(const std::vector<float>& matrix, int rows, int cols) {
  Quantized q{std::vector<float>(matrix.size()), std::vector<float>(rows)};
  for (int r = 0; r < rows; ++r) {
    float amax = 0.0f;
    for (int c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(matrix[r * cols + c]));
    q.scales[r] = fp8_scale(amax, true);
    for (int c = 0; c < cols; ++c) q.values[r * cols + c] = e4m3_to_float(float_to_e4m3(matrix[r * cols + c] / q.scales[r]));
  }
  return q;
}

struct Accumulation {
  bool gpu_like = false;
  int bits = 14;
  int block = 128;
};

double truncate_to_bits(double value, int bits) {
  if (value == 0.0) return 0.0;
  int exponent = 0;
  std::frexp(value, &exponent);
  const double quantum = std::ldexp(1.0, exponent - bits);
  return std::trunc(value / quantum) * quantum;
}

// y[n] = Σ_k a[k] · w[n, k] · a_scale · w_scale[n]
std::vector<double> matvec(const std::vector<float>& a, float a_scale, const Quantized& w, int rows, int cols,
                           const Accumulation& how) {
  std::vector<double> y(rows);
  for (int r = 0; r < rows; ++r) {
    const float* row = &w.values[static_cast<std::size_t>(r) * cols];
    if (!how.gpu_like) {
      double sum = 0.0;
      for (int c = 0; c < cols; ++c) sum += static_cast<double>(a[c]) * row[c];
      y[r] = sum * a_scale * w.scales[r];
      continue;
    }
    float total = 0.0f;
    for (int begin = 0; begin < cols; begin += how.block) {
      double block_sum = 0.0;
      for (int step = begin; step < std::min(cols, begin + how.block); step += 32) {
        double exact = 0.0;
        for (int c = step; c < std::min(cols, step + 32); ++c) exact += static_cast<double>(a[c]) * row[c];
        block_sum = truncate_to_bits(block_sum + exact, how.bits);
      }
      total += static_cast<float>(block_sum) * (a_scale * w.scales[r]);
    }
    y[r] = total;
  }
  return y;
}

}  // namespace

int main(int argc, char** argv) {
  const int draws = argc > 1 ? std::atoi(argv[1]) : 1000;
  Accumulation gpu{true, argc > 2 ? std::atoi(argv[2]) : 14, argc > 3 ? std::atoi(argv[3]) : 128};
  const int hidden = argc > 4 ? std::atoi(argv[4]) : 320, intermediate = argc > 5 ? std::atoi(argv[5]) : 384,
            tokens = argc > 6 ? std::atoi(argv[6]) : 2;
  if (draws < 1 || gpu.bits < 1 || gpu.block < 32 || gpu.block % 32 != 0 || hidden < 1 || intermediate < 1 ||
      tokens < 1) {
    std::fprintf(stderr, "fp8_accumulation_tail: draws, bits, H, I and T must be positive, block a multiple of 32\n");
    return 2;
  }
  std::mt19937_64 generator(1);
  std::uniform_real_distribution<float> x_dist(-1.0f, 1.0f);
  std::uniform_real_distribution<float> w13_dist(-1.0f / std::sqrt(float(hidden)), 1.0f / std::sqrt(float(hidden)));
  std::uniform_real_distribution<float> w2_dist(-1.0f / std::sqrt(float(intermediate)), 1.0f / std::sqrt(float(intermediate)));
  std::vector<double> errors;
  for (int draw = 0; draw < draws; ++draw) {
    double diff = 0.0, norm = 0.0;
    for (int t = 0; t < tokens; ++t) {
      std::vector<float> x(hidden), w13(2 * intermediate * hidden), w2(hidden * intermediate);
      for (float& v : x) v = to_bf16(x_dist(generator));
      for (float& v : w13) v = to_bf16(w13_dist(generator));
      for (float& v : w2) v = to_bf16(w2_dist(generator));
      const Quantized qx = quantize_rows(x, 1, hidden), q13 = quantize_rows(w13, 2 * intermediate, hidden),
                      q2 = quantize_rows(w2, hidden, intermediate);
      std::vector<double> out[2];
      for (int variant = 0; variant < 2; ++variant) {
        const Accumulation how = variant == 0 ? Accumulation{} : gpu;
        const std::vector<double> h = matvec(qx.values, qx.scales[0], q13, 2 * intermediate, hidden, how);
        std::vector<float> act(intermediate);
        for (int j = 0; j < intermediate; ++j) act[j] = to_bf16(h[j] / (1.0 + std::exp(-h[j])) * h[intermediate + j]);
        const Quantized qa = quantize_rows(act, 1, intermediate);
        out[variant] = matvec(qa.values, qa.scales[0], q2, hidden, intermediate, how);
        if (variant == 1)
          for (double& v : out[variant]) v = to_bf16(v);
      }
      for (int i = 0; i < hidden; ++i) {
        diff += (out[1][i] - out[0][i]) * (out[1][i] - out[0][i]);
        norm += out[0][i] * out[0][i];
      }
    }
    errors.push_back(std::sqrt(diff / norm));
  }
  std::sort(errors.begin(), errors.end());
  const long over = std::count_if(errors.begin(), errors.end(), [](double e) { return e > 2e-2; });
  std::printf("H=%d I=%d T=%d, accumulator %d bits, promoted every %d K, %d draws: median %.4f p90 %.4f p99 %.4f "
              "max %.4f; above 2e-2: %ld\n",
              hidden, intermediate, tokens, gpu.bits, gpu.block, draws, errors[draws / 2], errors[draws * 9 / 10],
              errors[draws * 99 / 100], errors.back(), over);
}
