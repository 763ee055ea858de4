// Seeded random layer inputs generated on the GPU with a counter-based hash: weights run to GBs
// (Mixtral bf16 w13 + w2 is 2.8 GB), far too slow to draw on the host. Copies go to the host only
// for the CPU reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hmoe/hmoe.hpp"

namespace hmoe::testkit {

// How tokens spread over experts (DESIGN.md §3): random, Zipf-like expert popularity (~1/rank), or
// every token to the same k experts.
enum class RoutingMode { kUniform, kZipf, kExtreme };
// Which MoeRunner entry point a check drives.
enum class Entry { kLogits, kTopK };

std::string to_string(RoutingMode mode);
std::string to_string(Entry entry);
std::optional<RoutingMode> parse_routing_mode(std::string_view text);
std::optional<Entry> parse_entry(std::string_view text);

// dst[i] ~ U(-scale, scale), never exactly zero, rounded to bf16. `salt` keeps tensors drawn from one
// seed independent of each other.
void fill_uniform_bf16(std::uint16_t* dst, std::size_t count, float scale, std::uint64_t seed,
                       std::uint64_t salt, cudaStream_t stream);
void fill_uniform_f32(float* dst, std::size_t count, float scale, std::uint64_t seed, std::uint64_t salt,
                      cudaStream_t stream);

// What decides which experts a token prefers: the expert popularity comes from popularity_seed (a
// property of the model, shared by every input set), the per-token draw from seed.
struct RoutingDraw {
  RoutingMode mode = RoutingMode::kUniform;
  std::uint64_t popularity_seed = 1;
  std::uint64_t seed = 1;
};

// Router logits [T, E] in spec.routing.logits_dtype, built from a random per-token ranking of the
// experts so that every comparison the routing makes has a wide margin: the GPU's fp32 routing and
// the float64 reference then pick the same experts. For grouped routing the ranking interleaves the
// groups (see random_inputs.cu) and the logits are placed so sigmoid(logit) + correction_bias lands on
// evenly spaced levels. correction_bias: [E] fp32 device, |bias| ≤ 0.05, grouped routing only
// (nullptr means zeros).
void generate_router_logits(const MoeSpec& spec, int num_tokens, const RoutingDraw& draw,
                            const float* correction_bias, void* logits, cudaStream_t stream);

// topk_ids [T, k] (distinct experts per token, in preference order) and topk_weights [T, k] in
// (0.1, 1), drawn with the same expert rankings as the logits.
void generate_topk(const MoeSpec& spec, int num_tokens, const RoutingDraw& draw, std::int32_t* topk_ids,
                   float* topk_weights, cudaStream_t stream);

}  // namespace hmoe::testkit
