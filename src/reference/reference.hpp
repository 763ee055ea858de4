// CPU oracle for every GPU test: the whole MoE layer of DESIGN.md §2 with float64 accumulation,
// both routing functions, and exact FP8 e4m3 quantisation emulation for every scheme.
#pragma once

#include <cstdint>
#include <vector>

#include "hmoe/hmoe.hpp"

namespace hmoe::reference {

// ---- Number formats (bit-exact) -------------------------------------------------------------
// bf16 is carried as its 16 raw bits; conversion from float rounds to nearest even, NaN stays NaN.
std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t bits);
// e4m3fn (max 448, no infinities, 0x7F/0xFF are NaN): round to nearest even, saturate to ±448
// (±Inf included, as the GPU's satfinite conversion does). Assumes the default rounding mode.
std::uint8_t float_to_e4m3(float value);
float e4m3_to_float(std::uint8_t bits);
constexpr float kE4m3Max = 448.0f;
// Smallest power of two ≥ value (UE8M0 scales); value > 0.
float round_up_pow2(float value);

// ---- Routing -------------------------------------------------------------------------------
struct Routing {
  int num_tokens = 0;
  int top_k = 0;
  std::vector<std::int32_t> ids;     // [T, k], in descending score order
  std::vector<float> weights;        // [T, k]
};
// logits [T, E] as float; computed in double. Ties break to the lower expert index.
// correction_bias [E] is used by the grouped function only (nullptr means zeros).
Routing route(const MoeSpec& spec, const float* logits, int num_tokens,
              const float* correction_bias = nullptr);

// ---- FP8 quantisation emulation ------------------------------------------------------------
// Conventions the GPU path must reproduce (all arithmetic in float unless stated):
//   amax  = max |v| over the group, v the element as float (bf16 inputs are exact; the float64
//           SwiGLU output is first rounded to bf16, as the GPU stores it between the GEMMs, and
//           as vLLM's bf16 intermediate cache does);
//   scale = amax / 448 (float division); with ue8m0_scales, round_up_pow2 of that;
//           an all-zero group gets scale 1 (its values quantise to exactly zero);
//   value = float_to_e4m3(v / scale) — a float division, not a multiply by a reciprocal;
//   the dequantised element is e4m3_to_float(value) × scale (exact in double).
// Dynamic per-tensor activation scales cover the whole tensor: all T rows of x, and all routed
// (token, slot) rows of the SwiGLU output, whichever rows are sampled.
struct Fp8Options {
  bool ue8m0_scales = false;         // round every computed scale up to a power of two (UE8M0)
  bool static_act_scale = false;     // per-tensor scheme: use the static scales below
  float act_scale = 1.0f;            // static per-tensor scale of x (GEMM1 input)
  float intermediate_act_scale = 1.0f;  // static per-tensor scale of the SwiGLU output (GEMM2 input)
};

// The dequantisation multiplier for a group whose largest magnitude is amax (see above).
float fp8_scale(float amax, bool ue8m0);

// A quantised matrix family [E, N, K]: values e4m3 and dequantisation multipliers, laid out as
// per-tensor [E], per-channel [E, N], block [E, ceil(N/128), ceil(K/128)] (weight_scale_inv).
struct QuantizedWeights {
  QuantScheme scheme = QuantScheme::kNone;
  int experts = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> values;  // [E, N, K] e4m3 bits
  std::vector<float> scales;
};
// Quantises bf16 weights [E, N, K]: scale = amax / 448 over the scheme's group (a safe scale for an
// all-zero group), value = e4m3(w / scale).
QuantizedWeights quantize_weights(QuantScheme scheme, const std::uint16_t* weights, int experts,
                                  int rows, int cols, const Fp8Options& options = {});
// Row `row` of expert `expert`, dequantised (value × its scale), as double [cols].
void dequantize_weight_row(const QuantizedWeights& weights, int expert, int row, double* out);

// Quantises activation rows [M, K] with the scheme's activation granularity (per-tensor, per-token,
// or per token per 128 columns); returns the dequantised values as double [M, K]. This is what the
// GPU path computes with, so the FP8 reference applies it to x and to the SwiGLU output.
// Per-tensor: options.act_scale when static_act_scale, else dynamic over these rows.
std::vector<double> fake_quantize_activations(QuantScheme scheme, const double* rows, int num_rows,
                                              int cols, const Fp8Options& options = {});

// ---- The layer -----------------------------------------------------------------------------
struct Bf16Layer {
  const std::uint16_t* x = nullptr;    // [T, H]
  const std::uint16_t* w13 = nullptr;  // [E, 2I, H], HF layout (gate rows then up rows)
  const std::uint16_t* w2 = nullptr;   // [E, H, I]
};
struct Fp8Layer {
  const std::uint16_t* x = nullptr;    // [T, H] bf16, quantised inside with the scheme
  const QuantizedWeights* w13 = nullptr;
  const QuantizedWeights* w2 = nullptr;
  Fp8Options options;
};

// out[i, :] for token tokens[i] (so a large T can be checked on a sample of rows), float64.
// ids outside [0, E) contribute nothing. threads ≤ 0 means all hardware threads.
// FP8 with a dynamic per-tensor scale runs GEMM1 over every token to find the intermediate's amax.
std::vector<double> moe_layer(const MoeSpec& spec, const Bf16Layer& layer, const Routing& routing,
                              const std::vector<int>& tokens, int threads = 0);
std::vector<double> moe_layer(const MoeSpec& spec, const Fp8Layer& layer, const Routing& routing,
                              const std::vector<int>& tokens, int threads = 0);

// ‖out − ref‖ / ‖ref‖ over n values; NaN or Inf anywhere in out gives +Inf.
double relative_error(const double* ref, const double* out, std::size_t n);

}  // namespace hmoe::reference
