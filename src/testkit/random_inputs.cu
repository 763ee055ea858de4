// Counter-based generation of weights, activations and routing inputs: element i of a tensor is a
// pure function of (seed, salt, i), so any tensor can be regenerated without storing it.
#include "testkit/random_inputs.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "testkit/cuda_handles.hpp"

namespace hmoe::testkit {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kMaxGridBlocks = 8192;

// Salts separating the draws made from one RoutingDraw::seed.
constexpr std::uint64_t kSaltRanking = 0x52414e4bull;
constexpr std::uint64_t kSaltLogitJitter = 0x4a495454ull;
constexpr std::uint64_t kSaltTopkWeights = 0x544f504bull;
constexpr std::uint64_t kSaltPopularity = 0x504f5055ull;

// splitmix64's finaliser: every output bit depends on every input bit.
__host__ __device__ constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t stream_key(std::uint64_t seed, std::uint64_t salt) {
  return mix64(mix64(seed) ^ (salt * 0x9E3779B97F4A7C15ull));
}

__device__ std::uint64_t counter_hash(std::uint64_t key, std::uint64_t counter) {
  return mix64(key ^ mix64(counter));
}

// NOTE: both maps use 23 random bits so (2m + 1) is exact in fp32; the odd numerator keeps the
// symmetric value away from zero and the open-interval value away from 0 and 1.
__device__ float symmetric_unit(std::uint64_t hash) {  // (-1, 1), never 0
  const int m = static_cast<int>(hash >> 41);
  return static_cast<float>(2 * m + 1 - (1 << 23)) * 0x1p-23f;
}
__device__ float open_unit(std::uint64_t hash) {  // (0, 1)
  const int m = static_cast<int>(hash >> 41);
  return static_cast<float>(2 * m + 1) * 0x1p-24f;
}

unsigned grid_for(std::size_t count) {
  const std::size_t blocks = (count + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, kMaxGridBlocks));
}

__global__ void fill_uniform_bf16_kernel(std::uint16_t* dst, std::size_t count, float scale, std::uint64_t key) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(symmetric_unit(counter_hash(key, i)) * scale));
}

__global__ void fill_uniform_f32_kernel(float* dst, std::size_t count, float scale, std::uint64_t key) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = symmetric_unit(counter_hash(key, i)) * scale;
}

// How one token ranks the experts. Groups are ranked first, then the experts inside each group, and
// the ranks interleave the groups: rank = rank_in_group · G + group_rank. Group scores (top-2 sums)
// then keep the group order with a margin, and the top-k is spread over the kept groups while experts
// of dropped groups outrank some chosen ones, so routing that ignored the groups would be caught.
struct RankingParams {
  int num_experts = 0;
  int num_groups = 1;
  const float* expert_weight = nullptr;  // [E] popularity
  const float* group_weight = nullptr;   // [G] sum of its experts' popularity
  bool by_popularity_only = false;       // extreme: every token ranks by popularity alone
  std::uint64_t key = 0;
};

__device__ bool ranks_before(float key_a, int a, float key_b, int b) {
  return key_a > key_b || (key_a == key_b && a < b);
}

// One block per token. Weighted sampling without replacement (Efraimidis–Spirakis): sorting by
// log(u) / weight descending draws items in proportion to their weight.
__global__ void rank_experts_kernel(RankingParams params, int* ranks) {
  extern __shared__ float sort_keys[];  // E expert keys, then G group keys
  const int token = blockIdx.x;
  const int experts = params.num_experts;
  const int groups = params.num_groups;
  const int group_size = experts / groups;
  for (int j = threadIdx.x; j < experts + groups; j += blockDim.x) {
    const float weight = j < experts ? params.expert_weight[j] : params.group_weight[j - experts];
    const std::uint64_t counter = static_cast<std::uint64_t>(token) * (experts + groups) + j;
    sort_keys[j] = params.by_popularity_only ? weight : logf(open_unit(counter_hash(params.key, counter))) / weight;
  }
  __syncthreads();
  for (int expert = threadIdx.x; expert < experts; expert += blockDim.x) {
    const int group = expert / group_size;
    int group_rank = 0;
    for (int other = 0; other < groups; ++other)
      group_rank += ranks_before(sort_keys[experts + other], other, sort_keys[experts + group], group);
    int rank_in_group = 0;
    for (int other = group * group_size; other < (group + 1) * group_size; ++other)
      rank_in_group += ranks_before(sort_keys[other], other, sort_keys[expert], expert);
    ranks[static_cast<std::size_t>(token) * experts + expert] = rank_in_group * groups + group_rank;
  }
}

// Softmax: evenly spaced levels by rank plus a jitter of ±10% of the spacing, so neighbours stay
// ≥ 0.8 spacing apart (and distinct after bf16 rounding: the levels stay within ±1.3, where a bf16
// step is ≤ 1/128 < 0.8 × 0.01). Grouped: c = sigmoid(logit) + bias is placed on levels 0.8/E apart
// in (0.1, 0.9], far above fp32 rounding of sigmoid.
struct LogitParams {
  int num_experts = 0;
  bool grouped = false;
  float softmax_spacing = 0.0f;
  const float* correction_bias = nullptr;
  std::uint64_t jitter_key = 0;
};

__global__ void logits_from_ranks_kernel(const int* ranks, std::size_t count, LogitParams params,
                                         float* logits_f32, std::uint16_t* logits_bf16) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int rank = ranks[i];
    const int expert = static_cast<int>(i % params.num_experts);
    float logit;
    if (params.grouped) {
      const float level = 0.9f - static_cast<float>(rank) * (0.8f / static_cast<float>(params.num_experts));
      const float bias = params.correction_bias != nullptr ? params.correction_bias[expert] : 0.0f;
      const float score = level - bias;  // the sigmoid output that puts c on its level
      logit = logf(score) - log1pf(-score);
    } else {
      const float centred_rank = 0.5f * static_cast<float>(params.num_experts - 1) - static_cast<float>(rank);
      const float jitter = 0.1f * symmetric_unit(counter_hash(params.jitter_key, i));
      logit = (centred_rank + jitter) * params.softmax_spacing;
    }
    if (logits_f32 != nullptr) logits_f32[i] = logit;
    if (logits_bf16 != nullptr) logits_bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(logit));
  }
}

__global__ void topk_from_ranks_kernel(const int* ranks, int num_tokens, int num_experts, int top_k,
                                       std::uint64_t weight_key, std::int32_t* topk_ids, float* topk_weights) {
  const std::size_t count = static_cast<std::size_t>(num_tokens) * num_experts;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int rank = ranks[i];
    if (rank >= top_k) continue;
    const std::size_t token = i / num_experts;
    const std::size_t slot = token * top_k + rank;
    topk_ids[slot] = static_cast<std::int32_t>(i % num_experts);
    topk_weights[slot] = 0.1f + 0.9f * open_unit(counter_hash(weight_key, slot));
  }
}

// Ranks [T, E] for the draw; num_groups = 1 ranks all experts together.
DeviceBuffer rank_experts(int num_experts, int num_groups, int num_tokens, const RoutingDraw& draw,
                          cudaStream_t stream) {
  // Popularity order: a seeded shuffle, so the popular experts are not simply the low indices.
  std::vector<int> by_popularity(num_experts);
  std::iota(by_popularity.begin(), by_popularity.end(), 0);
  const std::uint64_t popularity_key = stream_key(draw.popularity_seed, kSaltPopularity);
  std::sort(by_popularity.begin(), by_popularity.end(),
            [popularity_key](int a, int b) { return mix64(popularity_key ^ a) < mix64(popularity_key ^ b); });
  std::vector<float> expert_weight(num_experts, 1.0f);
  if (draw.mode != RoutingMode::kUniform) {
    for (int position = 0; position < num_experts; ++position)
      expert_weight[by_popularity[position]] = 1.0f / static_cast<float>(position + 1);
  }
  std::vector<float> group_weight(num_groups, 0.0f);
  const int group_size = num_experts / num_groups;
  for (int expert = 0; expert < num_experts; ++expert) group_weight[expert / group_size] += expert_weight[expert];

  DeviceBuffer weights_device((num_experts + num_groups) * sizeof(float));
  std::vector<float> weights_host = expert_weight;
  weights_host.insert(weights_host.end(), group_weight.begin(), group_weight.end());
  copy_to_device(weights_device.get(), weights_host, stream);

  RankingParams params;
  params.num_experts = num_experts;
  params.num_groups = num_groups;
  params.expert_weight = weights_device.as<float>();
  params.group_weight = weights_device.as<float>() + num_experts;
  params.by_popularity_only = draw.mode == RoutingMode::kExtreme;
  params.key = stream_key(draw.seed, kSaltRanking);
  DeviceBuffer ranks(static_cast<std::size_t>(num_tokens) * num_experts * sizeof(int));
  if (num_tokens > 0) {
    const std::size_t shared_bytes = (num_experts + num_groups) * sizeof(float);
    rank_experts_kernel<<<num_tokens, kThreadsPerBlock, shared_bytes, stream>>>(params, ranks.as<int>());
    HMOE_CUDA_CHECK(cudaGetLastError());
  }
  // NOTE: weights_device is freed on return while the kernel may still read it; wait for it.
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return ranks;
}

}  // namespace

std::string to_string(RoutingMode mode) {
  switch (mode) {
    case RoutingMode::kUniform: return "uniform";
    case RoutingMode::kZipf: return "zipf";
    case RoutingMode::kExtreme: return "extreme";
  }
  return "?";
}

std::string to_string(Entry entry) { return entry == Entry::kLogits ? "logits" : "topk"; }

std::optional<RoutingMode> parse_routing_mode(std::string_view text) {
  for (RoutingMode mode : {RoutingMode::kUniform, RoutingMode::kZipf, RoutingMode::kExtreme})
    if (text == to_string(mode)) return mode;
  return std::nullopt;
}

std::optional<Entry> parse_entry(std::string_view text) {
  for (Entry entry : {Entry::kLogits, Entry::kTopK})
    if (text == to_string(entry)) return entry;
  return std::nullopt;
}

void fill_uniform_bf16(std::uint16_t* dst, std::size_t count, float scale, std::uint64_t seed, std::uint64_t salt,
                       cudaStream_t stream) {
  if (count == 0) return;
  fill_uniform_bf16_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(dst, count, scale, stream_key(seed, salt));
  HMOE_CUDA_CHECK(cudaGetLastError());
}

void fill_uniform_f32(float* dst, std::size_t count, float scale, std::uint64_t seed, std::uint64_t salt,
                      cudaStream_t stream) {
  if (count == 0) return;
  fill_uniform_f32_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(dst, count, scale, stream_key(seed, salt));
  HMOE_CUDA_CHECK(cudaGetLastError());
}

void generate_router_logits(const MoeSpec& spec, int num_tokens, const RoutingDraw& draw,
                            const float* correction_bias, void* logits, cudaStream_t stream) {
  const bool grouped = spec.routing.function == RoutingFunction::kGroupedSigmoidTopK;
  const int groups = grouped ? spec.routing.num_groups : 1;
  DeviceBuffer ranks = rank_experts(spec.num_experts, groups, num_tokens, draw, stream);
  const std::size_t count = static_cast<std::size_t>(num_tokens) * spec.num_experts;
  if (count == 0) return;
  LogitParams params;
  params.num_experts = spec.num_experts;
  params.grouped = grouped;
  params.softmax_spacing = std::max(0.01f, 2.0f / static_cast<float>(spec.num_experts));
  params.correction_bias = correction_bias;
  params.jitter_key = stream_key(draw.seed, kSaltLogitJitter);
  const bool bf16 = spec.routing.logits_dtype == LogitsDType::kBFloat16;
  logits_from_ranks_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(
      ranks.as<int>(), count, params, bf16 ? nullptr : static_cast<float*>(logits),
      bf16 ? static_cast<std::uint16_t*>(logits) : nullptr);
  HMOE_CUDA_CHECK(cudaGetLastError());
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));  // before `ranks` is freed
}

void generate_topk(const MoeSpec& spec, int num_tokens, const RoutingDraw& draw, std::int32_t* topk_ids,
                   float* topk_weights, cudaStream_t stream) {
  DeviceBuffer ranks = rank_experts(spec.num_experts, 1, num_tokens, draw, stream);
  const std::size_t count = static_cast<std::size_t>(num_tokens) * spec.num_experts;
  if (count == 0) return;
  topk_from_ranks_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(
      ranks.as<int>(), num_tokens, spec.num_experts, spec.top_k, stream_key(draw.seed, kSaltTopkWeights), topk_ids,
      topk_weights);
  HMOE_CUDA_CHECK(cudaGetLastError());
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));  // before `ranks` is freed
}

}  // namespace hmoe::testkit
