// The whole MoE layer in one kernel at the smallest token counts (T ≤ kMaxTokens): routing (or the
// caller's top-k), GEMM1 + SwiGLU, GEMM2 × routing weight and the combine, one launch instead of
// 5–7 (docs/DISPATCH.md, "Fused decode layer"). Every CTA routes the few tokens itself, so no
// kernel boundary is needed before GEMM1; one grid-wide barrier separates GEMM1 from GEMM2. The dot
// products run on the CUDA cores in fp32 (few tokens per expert: a weight byte meets one or two
// tokens, so the layer is bound by weight bytes, not by arithmetic); FP8 activations are quantised
// with the same scales and rounding as the quantisation kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "hmoe/hmoe.hpp"

namespace hmoe::decode {

inline constexpr int kMaxTokens = 4;
inline constexpr int kMaxSlots = 32;     // T·k
inline constexpr int kMaxExperts = 256;  // the routing keeps a token's logits in one warp (8 per lane)

struct DecodeLaunch {
  int num_tokens = 0;
  const void* router_logits = nullptr;      // [T, E]; nullptr: topk_ids / topk_weights are the routing
  const std::int32_t* topk_ids = nullptr;   // [T, k], run_from_topk
  const float* topk_weights = nullptr;
  std::int32_t* routed_ids = nullptr;       // [T, k] workspace: the routing written out (logits only)
  float* routed_weights = nullptr;
  const void* x = nullptr;                  // [T, H] bf16
  void* out = nullptr;                      // [T, H] bf16
  Weights weights;
  const float* act_scale = nullptr;         // fp8-tensor static scales (nullptr: dynamic)
  const float* intermediate_act_scale = nullptr;
  void* intermediate = nullptr;             // [T·k, I] bf16 workspace
  int* invalid_id_count = nullptr;
};

// Whether the fused layer can run this spec at T tokens (shape, routing width, shared memory).
bool applies(const MoeSpec& spec, int num_tokens);

// The kernel's name for the spec (PlanInfo, `hmoe bench --explain`).
std::string kernel_name(const MoeSpec& spec);

// Enqueues the layer: one cooperative launch of num_sms CTAs. Requires applies(spec, T).
void launch(const MoeSpec& spec, const DecodeLaunch& launch, int num_sms, cudaStream_t stream);

// Loads the kernel and sets its shared-memory limit (module loading is lazy).
void prepare(const MoeSpec& spec);

}  // namespace hmoe::decode
