// hmoe — fused Mixture-of-Experts layers for NVIDIA Hopper (sm_90a).
// The public C++ API: describe the layer (MoeSpec), prepare weights once, plan a runner, run it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace hmoe {

// Every invalid argument or failed CUDA call surfaces as hmoe::Error; the message names the
// offending argument, its value and what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class WeightDType { kBF16, kFP8E4M3 };

// FP8 weight × activation schemes of DESIGN.md §2 (kNone for BF16 weights).
enum class QuantScheme {
  kNone,
  kPerTensor,            // one weight scale per expert and matrix × per-tensor activation scale
  kPerChannelPerToken,   // one weight scale per output row × dynamic per-token activation scale
  kBlock128,             // 128×128 weight blocks × dynamic 1×128 activation groups
};

enum class RoutingFunction {
  kSoftmaxTopK,          // p = softmax(logits); top-k of p; optional renormalise
  kGroupedSigmoidTopK,   // DeepSeek-V3: sigmoid + bias, best groups, top-k, normalise, scale
};

enum class LogitsDType { kFloat32, kBFloat16 };

struct RoutingSpec {
  RoutingFunction function = RoutingFunction::kSoftmaxTopK;
  bool renormalize = true;               // softmax only: divide the top-k by their sum
  int num_groups = 1;                    // grouped only: n_group
  int topk_groups = 1;                   // grouped only: groups kept
  float routed_scaling_factor = 1.0f;    // grouped only: multiplies the normalised weights
  LogitsDType logits_dtype = LogitsDType::kFloat32;
};

struct MoeSpec {
  int num_experts = 0;                   // E
  int top_k = 0;                         // k
  int hidden = 0;                        // H
  int intermediate = 0;                  // I (per expert)
  WeightDType weight_dtype = WeightDType::kBF16;
  QuantScheme scheme = QuantScheme::kNone;
  RoutingSpec routing;
  // Batch invariance: a token's output bits depend only on that token's inputs, never on T or on
  // which other tokens share the batch (one fixed GEMM variant for every T; docs/RELIABILITY.md).
  // For reproducible serving and RL rollouts; costs speed where another plan would be faster.
  bool batch_invariant = false;
  // FP8 only: round every activation scale hmoe computes (dynamic scales of x and of the SwiGLU
  // output) up to a power of two (UE8M0), as DeepSeek-V3-style checkpoints expect. Weight scales
  // are used as given; quantize_weights rounds the ones it computes the same way.
  bool ue8m0_scales = false;
};

// The model presets of DESIGN.md §3 ("mixtral-8x7b", "qwen3-30b-a3b", ...). Throws on an unknown name.
MoeSpec preset(std::string_view name);
std::vector<std::string> preset_names();

// Alignment the kernels need of hidden and intermediate (elements).
inline constexpr int kDimAlignment = 64;
// Largest supported hidden and intermediate (elements): keeps every TMA row coordinate
// (expert × 2I) and every grid dimension within 32 bits.
inline constexpr int kMaxDim = 65536;
// Largest supported E and k (the routing kernels keep one token's logits in one warp's registers).
inline constexpr int kMaxExperts = 1024;
inline constexpr int kMaxTopK = 32;

// Throws hmoe::Error naming the first field that is out of range.
void validate(const MoeSpec& spec);

// ---- One-time weight preparation -----------------------------------------------------------
// Sources use the vLLM/HF layouts: w13 [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up), w2 [E, H, I],
// row-major; bf16, or e4m3 bytes for FP8 specs. The prepared buffers are what Weights points at;
// their layout is private. FP8 weight scales are not prepared: Weights points at them as they are.
std::size_t prepared_w13_bytes(const MoeSpec& spec);
std::size_t prepared_w2_bytes(const MoeSpec& spec);
void prepare_weights(const MoeSpec& spec, const void* w13_src, const void* w2_src, void* w13_dst,
                     void* w2_dst, cudaStream_t stream);

// ---- FP8 weights ---------------------------------------------------------------------------
// The two weight matrices of a layer: w13 [E, 2I, H] and w2 [E, H, I] (rows N, columns K).
enum class WeightMatrix { kW13, kW2 };

// fp32 dequantisation scales per matrix, in the checkpoint layouts (vLLM's w13_weight_scale /
// w2_weight_scale, DeepSeek-V3's weight_scale_inv): fp8-tensor [E]; fp8-channel [E, N];
// fp8-block [E, ceil(N/128), ceil(K/128)]. 0 for bf16 specs.
std::size_t weight_scale_count(const MoeSpec& spec, WeightMatrix matrix);

// Quantises bf16 weights [E, N, K] (device, HF layout) into e4m3 values [E, N, K] (device, the
// source layout prepare_weights takes) and their scales (weight_scale_count floats): per scheme
// group, scale = amax / 448 (rounded up to a power of two when spec.ue8m0_scales), an all-zero
// group gets scale 1, value = e4m3(w / scale) rounded to nearest even and saturated. FP8 specs only.
void quantize_weights(const MoeSpec& spec, WeightMatrix matrix, const void* bf16_weights, void* fp8_weights,
                      float* scales, cudaStream_t stream);

struct Weights {
  const void* w13 = nullptr;             // prepared w13 (prepared_w13_bytes)
  const void* w2 = nullptr;              // prepared w2 (prepared_w2_bytes)
  const float* correction_bias = nullptr;  // [E] fp32, grouped routing only; nullptr means zeros
  const float* w13_scale = nullptr;      // FP8 only: weight_scale_count(spec, kW13) floats, device
  const float* w2_scale = nullptr;       // FP8 only: weight_scale_count(spec, kW2) floats, device
};

// ---- Planning and running -------------------------------------------------------------------
enum class Orientation {
  kAuto,     // pick by tokens per expert
  kNormal,   // tokens on WGMMA's M side, weight rows on N
  kSwapAB,   // weight rows on WGMMA's M side, tokens on N (few tokens per expert)
};

// Whether runs of T ≤ 4 tokens are one fused kernel (PlanOptions::fused_decode; docs/DISPATCH.md,
// "Fused decode layer").
enum class FusedDecode {
  kAuto,   // at the T whose bucket in this device's tuned table says "fused" (no table: never)
  kOn,     // wherever the fused layer applies (A/B timing, the tuner, tests)
  kOff,    // never: the unfused kernels at every T
};   // NOTE: the values are the C API's hmoe_plan_options.fused_decode (0, 1, 2)

// The stages of a layer, as bits of PlanOptions::skip_stages.
enum StageBit : std::uint32_t {
  kStageRouting = 1u << 0,        // router logits → top-k (run_from_logits only)
  kStagePermute = 1u << 1,        // counts, work list, row assignment, x gather
  kStageQuantizeX = 1u << 2,      // FP8: x → e4m3 rows and scales
  kStageGemm1 = 1u << 3,          // GEMM1 + SwiGLU
  kStageRequantize = 1u << 4,     // FP8: SwiGLU output → e4m3 rows and scales
  kStageGemm2 = 1u << 5,          // GEMM2 × routing weight
  kStageCombine = 1u << 6,        // sum over the k slots into out
};

struct PlanOptions {
  int max_tokens = 0;                    // largest T any run will pass; sizes the workspace
  Orientation orientation = Orientation::kAuto;
  // Workspace cap in bytes (0 = none). When max_tokens would need more, each run processes its
  // tokens in chunks of chunk_tokens() inside run_* (still no allocation, no host sync) and
  // workspace_bytes() is the exact need of one chunk. Throws if even one token does not fit.
  std::size_t max_workspace_bytes = 0;
  // Internal (the tuner, tests): run this GEMM pair for every T instead of the dispatcher's choice,
  // as "<gemm1 kernel>+<gemm2 kernel>" (`hmoe info --kernels` lists them). Empty: hmoe chooses.
  std::string force_variant;
  // Replay whole layers as CUDA graphs (docs/DISPATCH.md, "Graph replay"): from the second call with
  // the same entry point, T and device pointers, run_* enqueues the layer with one cudaGraphLaunch
  // (CPU cost ~1.5 µs) instead of 5–9 kernel launches (~4 µs each on a slow host). The first call of
  // such a key runs eagerly, the second captures (one-time CPU cost of a capture and instantiate,
  // about a millisecond; unmeasured). Up to 32 graphs are kept, the least recently used leaves
  // first. Calls made while the caller's stream is being captured enqueue the kernels themselves.
  // A copy of the runner shares its graphs. Launches of one graph are ordered behind each other,
  // also across streams.
  bool replay_graphs = false;
  // Run a small copy of the layer (H = I = 128, same E, k, routing and scheme, the GEMM variants
  // this layer's T = 1 plan runs, zero weights) at plan time on a private stream, with enough
  // tokens (320–1056 for the presets, at most 4096) that both GEMMs give every resident CTA on every
  // SM a work item, with its own stream-ordered scratch (up to ~30 MB, freed before the constructor
  // returns), and wait for it (milliseconds of plan time). A process's first call of the layer's
  // kernels costs more than later ones, on the CPU and on each SM (docs/PERF.md, "First call v4"
  // and "v5"). Off: the constructor touches no device memory and launches nothing.
  bool warm_up = true;
  // Internal (`hmoe bench --skip`): leave these stages (StageBit) out of every run, to attribute a
  // layer's time to its stages. The output is then WRONG; every stage a skipped one would have fed
  // reads what the last full run left in the workspace, so run the layer once without skipping on
  // the same workspace and T first, with fused_decode = kOff (the bench does), or the skipped stages'
  // inputs are garbage.
  std::uint32_t skip_stages = 0;
  // Internal (`hmoe bench/check --split-k`, tests): how many ways the Swap-AB GEMMs split K over
  // CTAs at decode sizes (docs/DISPATCH.md, "Split along K"). 0: hmoe's rule; 1: never; n > 1: n
  // ways wherever a Swap-AB variant runs, capped by K (8+ K blocks a split) and the workspace.
  // Batch-invariant layers never split (the sum order would depend on T).
  int split_k = 0;
  // Run T ≤ 4 as one fused kernel (docs/DISPATCH.md, "Fused decode layer"; PlanInfo::fused_decode
  // says when). On H200 (2026-12-03) it wins at T = 1 for some layers (deepseek-v3-tp8 bf16: 43.8
  // against 50.5 µs), ties for others (deepseek-v3-tp8 fp8-block 38.5 / 39.2, qwen3-30b-a3b fp8-block
  // 30.8 / 31.1), loses for qwen3-30b-a3b bf16 (35.7 against 34.3 µs) and at T = 2…4 (docs/PERF.md):
  // hence kAuto, where the tuned table's bucket for T decides (`hmoe tune` times the fused layer as
  // one more candidate). Runners that force an orientation or a variant, skip stages, set split_k or
  // are batch-invariant never fuse, whatever this field says. HMOE_FUSED_DECODE=1 / =0 in the
  // environment acts as kOn / kOff for every runner, overriding this field (A/B timing).
  FusedDecode fused_decode = FusedDecode::kAuto;
};

struct RunArgs {
  int num_tokens = 0;                    // T; 0 is valid and does nothing
  const void* x = nullptr;               // [T, H] bf16, device
  void* out = nullptr;                   // [T, H] bf16, device; every element is written
  Weights weights;                       // prepared, device
  void* workspace = nullptr;             // device, at least workspace_bytes(), 256-byte aligned
  std::size_t workspace_size = 0;        // bytes available at workspace
  // Optional device counter: each (token, slot) whose expert id lies outside [0, E) adds one.
  // Such a slot contributes nothing to its token's output.
  // Accumulates over every chunk of a run and over runs; the caller zeroes it.
  int* invalid_id_count = nullptr;
  // fp8-tensor only: static activation scales (vLLM's a1_scale / a2_scale), one float each on the
  // device. nullptr: the scale is dynamic — amax / 448 over all of x, or over every routed row of
  // the SwiGLU output. The other schemes always quantise activations dynamically.
  const float* act_scale = nullptr;
  const float* intermediate_act_scale = nullptr;
};

// What one run launches, for inspection (`hmoe bench --explain`, tests).
struct PlanInfo {
  Orientation orientation = Orientation::kNormal;
  int token_tile = 0;                    // tokens per GEMM tile
  int weight_tile = 0;                   // weight rows per GEMM tile
  std::string gemm1_kernel;
  std::string gemm2_kernel;
  int num_chunks = 1;                    // runs of at most MoeRunner::chunk_tokens() tokens each
  int gemm1_splits = 1;                  // ways GEMM1 splits K over CTAs (1: not split)
  int gemm2_splits = 1;                  // the same for GEMM2
  // Who chose the variant: "analytic", "tuned:<table file>", "forced" or "batch-invariant". For a
  // fused decode plan, who turned the fused layer on: "tuned:<table file>" (its bucket says
  // "fused"), "option" (PlanOptions::fused_decode = kOn) or "environment" (HMOE_FUSED_DECODE=1).
  std::string source;
  // The whole layer runs as one kernel (docs/DISPATCH.md, "Fused decode layer"): gemm1_kernel
  // names it, gemm2_kernel is empty, and the tile fields above are the unfused plan's.
  bool fused_decode = false;
  // FP8: GEMM1's epilogue writes GEMM2's e4m3 input itself, so no separate re-quantisation pass runs:
  // the 256-row GEMM1 tiles, fp8-block (with the 1×128 group scales) and, where I % 128 == 0, fp8-tensor in
  // runs with a static intermediate scale (RunArgs.intermediate_act_scale set; HMOE_STATIC_REQUANT=0 turns
  // that part off). HMOE_FUSED_REQUANT=0 turns all of it off.
  bool fused_requant = false;
  // fp8-tensor with a dynamic intermediate scale (RunArgs.intermediate_act_scale null): GEMM1's epilogue
  // keeps the amax of its bf16 output, so the re-quantisation pass reads it once (HMOE_FUSED_REQUANT=0
  // keeps the separate amax pass).
  bool gemm1_amax = false;
};

namespace dispatch {
struct PlanOverrides;
class GraphCache;
}  // namespace dispatch

class MoeRunner {
 public:
  MoeRunner(const MoeSpec& spec, const PlanOptions& options);

  const MoeSpec& spec() const { return spec_; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  // Tokens one chunk processes: max_tokens unless PlanOptions::max_workspace_bytes forces less.
  int chunk_tokens() const { return chunk_tokens_; }
  // The plan a run with num_tokens tokens uses (the plan of its first chunk when chunked).
  PlanInfo plan_info(int num_tokens) const;

  // Graphs held for PlanOptions::replay_graphs (0 without it).
  std::size_t graph_count() const;

  // Routes with the spec's routing function, then runs the experts. router_logits: [T, E] device,
  // dtype spec.routing.logits_dtype. Asynchronous on stream; no allocation, no host synchronisation.
  void run_from_logits(const RunArgs& args, const void* router_logits, cudaStream_t stream) const;

  // Precomputed routing, as vLLM/SGLang's fused_experts: topk_ids [T, k] int32 and
  // topk_weights [T, k] fp32, device. An id outside [0, E) contributes nothing (see RunArgs).
  void run_from_topk(const RunArgs& args, const std::int32_t* topk_ids, const float* topk_weights,
                     cudaStream_t stream) const;

 private:
  void check_args(const RunArgs& args) const;
  void prepare_kernels() const;
  void warm_up() const;
  void run_experts(const RunArgs& args, const std::int32_t* topk_ids, const float* topk_weights, int num_sms,
                   cudaStream_t stream, const void* router_logits = nullptr) const;
  bool skips(StageBit stage) const { return (options_.skip_stages & stage) != 0; }
  // Whether a run (chunk) of num_tokens tokens is one fused decode kernel.
  bool fused_decode(int num_tokens) const;
  // Whether some run (chunk) of this runner is: plan time then prepares and warms up the kernel.
  bool fuses_at_any_decode_size() const;
  // The launches of a checked call, eagerly or into a capture (PlanOptions::replay_graphs).
  void enqueue_from_logits(const RunArgs& args, const void* router_logits, cudaStream_t stream) const;
  void enqueue_from_topk(const RunArgs& args, const std::int32_t* topk_ids, const float* topk_weights,
                         cudaStream_t stream) const;

  MoeSpec spec_;
  PlanOptions options_;
  int num_sms_ = 0;
  bool scatter_x_ = true;                // prefill x rows read once per token (HMOE_SCATTER_X=0: off)
  bool fused_requant_ = true;            // FP8 GEMM1 re-quantises its output where it can (HMOE_FUSED_REQUANT=0: off)
  bool static_requant_ = true;           // ... also under a static fp8-tensor scale (HMOE_STATIC_REQUANT=0: off)
  std::size_t workspace_bytes_ = 0;
  int chunk_tokens_ = 0;
  std::size_t w13_scale_bytes_ = 0;      // FP8 weight scales, for the overlap checks (0 for bf16)
  std::size_t w2_scale_bytes_ = 0;
  // A forced variant or this device's tuned table, found once here (docs/DISPATCH.md).
  std::shared_ptr<const dispatch::PlanOverrides> overrides_;
  std::shared_ptr<dispatch::GraphCache> graphs_;   // PlanOptions::replay_graphs only
};

// hmoe's version ("0.1.0").
std::string version();
// Names of every compiled expert-GEMM variant (all kernels are built ahead of time; nothing is
// compiled at run time).
std::vector<std::string> compiled_kernels();

// Short names used by the CLI and messages ("bf16", "fp8-block", "softmax", "grouped", ...).
std::string to_string(WeightDType value);
std::string to_string(QuantScheme value);
std::string to_string(RoutingFunction value);
std::string to_string(Orientation value);

}  // namespace hmoe
