// MoeRunner: validates once at plan time and cheaply at each run, then enqueues the stages
// routing → permute → GEMM1 (SwiGLU) → GEMM2 (× routing weight) → combine on the caller's stream.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "combine/combine.hpp"
#include "common/arguments.hpp"
#include "common/cuda_check.hpp"
#include "decode/decode_layer.hpp"
#include "dispatch/graph_cache.hpp"
#include "dispatch/plan.hpp"
#include "gemm/tensor_map.hpp"
#include "gemm/variants.hpp"
#include "dispatch/tuned_table.hpp"
#include "hmoe/hmoe.hpp"
#include "permute/permute.hpp"
#include "quant/activations.hpp"
#include "routing/routing.hpp"

namespace hmoe {
namespace {

constexpr int kMaxTokens = 1 << 20;

template <typename T>
T* at(void* workspace, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<std::uint8_t*>(workspace) + offset);
}

template <typename T>
const T* advance(const T* pointer, std::size_t bytes) {
  return reinterpret_cast<const T*>(reinterpret_cast<const std::uint8_t*>(pointer) + bytes);
}

using arguments::Buffer;
using arguments::require_alignment;
using arguments::require_pointer;

// The workspace and the output are written during a run: neither may overlap anything else it
// touches, except that out may be x itself (in place: every chunk gathers its x rows before its
// combine writes the same rows).
void require_disjoint(std::initializer_list<Buffer> list) {
  arguments::require_disjoint(list, "RunArgs.out", "RunArgs.x");
}

int device_sm_count() {
  int device = 0;
  HMOE_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0;
  HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  HMOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Every pointer a layer's launches read or write: a graph captured for one key is valid for exactly
// these (and T, and the device).
dispatch::GraphKey graph_key(int entry, const RunArgs& args, const void* routing_a, const void* routing_b) {
  dispatch::GraphKey key;
  key.entry = entry;
  key.num_tokens = args.num_tokens;
  HMOE_CUDA_CHECK(cudaGetDevice(&key.device));
  key.pointers = {args.x, args.out, args.workspace, args.weights.w13, args.weights.w2, args.weights.correction_bias,
                  args.weights.w13_scale, args.weights.w2_scale, args.invalid_id_count, args.act_scale,
                  args.intermediate_act_scale, routing_a, routing_b, nullptr};
  return key;
}

// Enqueues a checked call: through the graph cache (PlanOptions::replay_graphs) unless the caller's
// stream is being captured, else directly. `enqueue(stream)` issues the layer's launches.
template <class Enqueue>
void enqueue_or_replay(dispatch::GraphCache* graphs, int entry, const RunArgs& args, const void* routing_a,
                       const void* routing_b, cudaStream_t stream, const Enqueue& enqueue) {
  if (graphs == nullptr || stream_is_capturing(stream)) return enqueue(stream);
  graphs->run(graph_key(entry, args, routing_a, routing_b), stream,
              [](const void* context, cudaStream_t target) { (*static_cast<const Enqueue*>(context))(target); },
              &enqueue);
}

std::size_t logits_element_bytes(const MoeSpec& spec) {
  return spec.routing.logits_dtype == LogitsDType::kBFloat16 ? 2 : 4;
}

// What GEMM1 does for GEMM2's FP8 input (docs/DISPATCH.md, "GEMM1 re-quantises its own output"): writes it
// as e4m3 itself (the 256-row tiles: block scales, or per-tensor with a static intermediate scale
// and whole 128-column groups), or keeps the amax a dynamic per-tensor re-quantisation needs (every
// per-tensor GEMM1); otherwise the separate pass does everything. `fused`: HMOE_FUSED_REQUANT, `fused_static`:
// HMOE_STATIC_REQUANT (both on unless set to 0), as the runner read them.
struct Gemm1Requant {
  bool writes_fp8 = false;
  bool keeps_amax = false;
};

Gemm1Requant gemm1_requant(const MoeSpec& spec, const gemm::GemmVariant& gemm1, bool fused, bool fused_static,
                           bool static_scale) {
  Gemm1Requant requant;
  if (!fused) return requant;
  if (spec.scheme == QuantScheme::kBlock128) requant.writes_fp8 = gemm1.fused_requant;
  if (spec.scheme == QuantScheme::kPerTensor) {
    requant.writes_fp8 = static_scale && fused_static && gemm1.fused_requant && spec.intermediate % gemm::kScaleGroup == 0;
    requant.keeps_amax = !static_scale && gemm1.quant == gemm::QuantKind::kEpilogueScale;
  }
  return requant;
}

// Ways one GEMM launch over at most `max_tiles` token tiles splits K (dispatch::choose_splits).
int gemm_splits(const MoeSpec& spec, const PlanOptions& options, const gemm::GemmVariant& variant, int max_tiles,
                int weight_rows, int k, int num_sms) {
  if (spec.batch_invariant) return 1;   // its workspace has no split region
  const long long output_tiles =
      static_cast<long long>(max_tiles) * ((weight_rows + variant.weight_tile - 1) / variant.weight_tile);
  return dispatch::choose_splits(variant, output_tiles, k, num_sms, options.split_k);
}

struct LayerSplits {
  int gemm1 = 1;
  int gemm2 = 1;
};

// Both GEMMs' splits for a run of `plan` over at most `max_tiles` token tiles.
LayerSplits layer_splits(const MoeSpec& spec, const PlanOptions& options, const dispatch::Plan& plan, int max_tiles,
                         int num_sms) {
  return {gemm_splits(spec, options, *plan.gemm1, max_tiles, 2 * spec.intermediate, spec.hidden, num_sms),
          gemm_splits(spec, options, *plan.gemm2, max_tiles, spec.hidden, spec.intermediate, num_sms)};
}

}  // namespace

MoeRunner::MoeRunner(const MoeSpec& spec, const PlanOptions& options) : spec_(spec), options_(options) {
  validate(spec_);
  if (options.max_tokens < 1 || options.max_tokens > kMaxTokens)
    throw Error("hmoe: invalid PlanOptions.max_tokens = " + std::to_string(options.max_tokens) + ": expected 1.." +
                std::to_string(kMaxTokens));
  const int orientation = static_cast<int>(options.orientation);
  if (orientation < static_cast<int>(Orientation::kAuto) || orientation > static_cast<int>(Orientation::kSwapAB))
    throw Error("hmoe: invalid PlanOptions.orientation = " + std::to_string(orientation) +
                ": expected 0 (auto), 1 (normal) or 2 (swap)");
  const int fused = static_cast<int>(options.fused_decode);
  if (fused < static_cast<int>(FusedDecode::kAuto) || fused > static_cast<int>(FusedDecode::kOff))
    throw Error("hmoe: invalid PlanOptions.fused_decode = " + std::to_string(fused) +
                ": expected FusedDecode::kAuto (0), kOn (1) or kOff (2)");
  if (options.split_k < 0)
    throw Error("hmoe: invalid PlanOptions.split_k = " + std::to_string(options.split_k) +
                ": expected 0 (hmoe's rule), 1 (never split) or the number of splits");
  if (spec_.batch_invariant && options.split_k > 1)
    throw Error("hmoe: invalid PlanOptions.split_k = " + std::to_string(options.split_k) +
                " with MoeSpec.batch_invariant: expected 0 or 1 (batch-invariant layers never split K)");
  if (spec_.batch_invariant && options.orientation == Orientation::kSwapAB)
    throw Error("hmoe: invalid PlanOptions.orientation = swap with MoeSpec.batch_invariant: expected auto or normal "
                "(batch-invariant mode always runs the normal orientation)");
  chunk_tokens_ = dispatch::chunk_tokens(spec_, options.max_tokens, options.max_workspace_bytes);
  workspace_bytes_ = dispatch::workspace_layout(spec_, chunk_tokens_).total;
  w13_scale_bytes_ = weight_scale_count(spec_, WeightMatrix::kW13) * sizeof(float);
  w2_scale_bytes_ = weight_scale_count(spec_, WeightMatrix::kW2) * sizeof(float);
  overrides_ = dispatch::make_plan_overrides(spec_, options_);
  scatter_x_ = permute::scatter_x_environment();
  fused_requant_ = gemm::fused_requant_environment();
  static_requant_ = gemm::static_requant_environment();
  if (options.replay_graphs) graphs_ = std::make_shared<dispatch::GraphCache>();
  if (!dispatch::current_device_name().empty()) {
    prepare_kernels();
    num_sms_ = device_sm_count();   // one query at plan time instead of two per run
    if (options.warm_up) warm_up();
  }
}

// NOTE: CUDA loads modules lazily and each GEMM variant raises its shared-memory limit on first
// use; done here, at plan time, the first run at any T costs what later runs do (a first call was
// measured 10–43× its steady state on H200 without this).
void MoeRunner::prepare_kernels() const {
  routing::prepare(spec_);
  permute::prepare();
  permute::prepare_route_permute(spec_);
  if (fuses_at_any_decode_size()) decode::prepare(spec_);
  if (spec_.weight_dtype == WeightDType::kFP8E4M3) quant::prepare();
  combine::prepare();
  gemm::prepare_tensor_maps();
  for (const gemm::GemmVariant& variant : gemm::gemm_variants()) variant.prepare();
}

namespace {

// The fused decode kernel's arguments for one run (chunk): routing from router_logits when given
// (written out to the workspace's top-k region), else the caller's topk_ids / topk_weights.
decode::DecodeLaunch fused_launch(const RunArgs& args, const dispatch::WorkspaceLayout& layout,
                                  const void* router_logits, const std::int32_t* topk_ids, const float* topk_weights) {
  decode::DecodeLaunch fused;
  fused.num_tokens = args.num_tokens;
  fused.router_logits = router_logits;
  fused.topk_ids = router_logits != nullptr ? nullptr : topk_ids;
  fused.topk_weights = router_logits != nullptr ? nullptr : topk_weights;
  fused.routed_ids = at<std::int32_t>(args.workspace, layout.topk_ids);
  fused.routed_weights = at<float>(args.workspace, layout.topk_weights);
  fused.x = args.x;
  fused.out = args.out;
  fused.weights = args.weights;
  fused.act_scale = args.act_scale;
  fused.intermediate_act_scale = args.intermediate_act_scale;
  fused.intermediate = at<void>(args.workspace, layout.intermediate);
  fused.invalid_id_count = args.invalid_id_count;
  return fused;
}

// Stream-ordered scratch of the plan-time warm-up, freed on its stream (no device-wide sync).
class ScratchStream {
 public:
  ScratchStream() { HMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ScratchStream(const ScratchStream&) = delete;
  ScratchStream& operator=(const ScratchStream&) = delete;
  ~ScratchStream() {
    for (void* pointer : allocations_) (void)cudaFreeAsync(pointer, stream_);
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  cudaStream_t get() const { return stream_; }
  // Zeroed device bytes, 256-byte aligned.
  void* zeroed(std::size_t bytes) {
    void* pointer = nullptr;
    HMOE_CUDA_CHECK(cudaMallocAsync(&pointer, std::max<std::size_t>(bytes, 256), stream_));
    allocations_.push_back(pointer);
    HMOE_CUDA_CHECK(cudaMemsetAsync(pointer, 0, std::max<std::size_t>(bytes, 256), stream_));
    return pointer;
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
};

// Restores the thread's stream-capture mode on exit.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { HMOE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace

// NOTE: a small copy of the layer (H = I = kWarmUpWidth, same E, k, routing and scheme) that runs
// the GEMM variants this layer's T = 1 plan runs, with enough tokens that both GEMMs have work for
// every resident CTA on every SM: token t's slot s goes to expert (t·k + s) mod E. What the first
// call lacks is per SM: on H200 the first call at T = 1 ran 1.3–1.7× a steady call even with L2
// reset before both (docs/PERF.md, "First call v5"), and the same warm-up with one token tile (a few
// SMs) left that; a real layer run just before took it to ~1.1×. Scratch: E small experts of zeros
// (deepseek-v3, E = 256, bf16: 24 MB) and up to kWarmUpMaxTokens rows of 256 bytes, stream-ordered
// and freed before returning. Relaxed capture mode: planning while this thread captures a graph
// elsewhere must neither fail nor invalidate it.
void MoeRunner::warm_up() const {
  constexpr int kWarmUpWidth = 128;   // a multiple of every variant's K step and of the FP8 blocks
  constexpr int kWarmUpCtasPerSm = 4;   // at least the resident CTAs of any decode variant (3 for 64×8 FP8)
  constexpr int kWarmUpMaxTokens = 4096;
  const RelaxedCaptureMode relaxed;
  const dispatch::Plan plan = dispatch::plan_for(spec_, 1, options_.orientation, overrides_.get());
  MoeSpec small = spec_;
  small.hidden = kWarmUpWidth;
  small.intermediate = kWarmUpWidth;
  const int weight_tile = std::min(plan.gemm1->weight_tile, plan.gemm2->weight_tile);
  const int tokens = dispatch::warm_up_tokens(small, plan.token_tile, weight_tile,
                                              kWarmUpCtasPerSm * std::max(num_sms_, 1), kWarmUpMaxTokens);
  PlanOptions options = options_;
  options.max_tokens = tokens;
  options.max_workspace_bytes = 0;
  options.replay_graphs = false;
  options.skip_stages = 0;
  options.warm_up = false;
  // Batch-invariant layers always run their one fixed variant (and may not force one).
  if (!spec_.batch_invariant) options.force_variant = std::string(plan.gemm1->name) + "+" + plan.gemm2->name;
  const MoeRunner runner(small, options);
  ScratchStream scratch;
  const std::size_t row_bytes = static_cast<std::size_t>(small.hidden) * 2;
  const std::size_t slots = static_cast<std::size_t>(tokens) * small.top_k;
  RunArgs args;
  args.num_tokens = tokens;
  args.x = scratch.zeroed(tokens * row_bytes);
  args.out = scratch.zeroed(tokens * row_bytes);
  args.workspace = scratch.zeroed(runner.workspace_bytes());
  args.workspace_size = std::max<std::size_t>(runner.workspace_bytes(), 256);
  args.weights.w13 = scratch.zeroed(prepared_w13_bytes(small));
  args.weights.w2 = scratch.zeroed(prepared_w2_bytes(small));
  if (small.weight_dtype == WeightDType::kFP8E4M3) {
    args.weights.w13_scale = static_cast<const float*>(scratch.zeroed(weight_scale_count(small, WeightMatrix::kW13) * 4));
    args.weights.w2_scale = static_cast<const float*>(scratch.zeroed(weight_scale_count(small, WeightMatrix::kW2) * 4));
  }
  if (small.scheme == QuantScheme::kPerTensor && small.batch_invariant) {
    // Batch-invariant fp8-tensor runs only with static scales (check_args).
    static const float kOnes[2] = {1.0f, 1.0f};
    auto* scales = static_cast<float*>(scratch.zeroed(sizeof(kOnes)));
    HMOE_CUDA_CHECK(cudaMemcpyAsync(scales, kOnes, sizeof(kOnes), cudaMemcpyHostToDevice, scratch.get()));
    args.act_scale = scales;
    args.intermediate_act_scale = scales + 1;
  }
  std::vector<std::int32_t> ids(slots);
  for (std::size_t slot = 0; slot < slots; ++slot) ids[slot] = static_cast<std::int32_t>(slot % small.num_experts);
  auto* topk_ids = static_cast<std::int32_t*>(scratch.zeroed(slots * 4));
  auto* topk_weights = static_cast<float*>(scratch.zeroed(slots * 4));
  HMOE_CUDA_CHECK(cudaMemcpyAsync(topk_ids, ids.data(), slots * 4, cudaMemcpyHostToDevice, scratch.get()));
  // Routing alone (its ids would select any expert); then the layer on the ids above.
  const dispatch::WorkspaceLayout layout = dispatch::workspace_layout(small, runner.chunk_tokens_);
  void* logits = scratch.zeroed(static_cast<std::size_t>(tokens) * small.num_experts * logits_element_bytes(small));
  routing::launch_topk(small, logits, nullptr, tokens, at<int>(args.workspace, layout.topk_ids),
                       at<float>(args.workspace, layout.topk_weights), scratch.get());
  runner.run_from_topk(args, topk_ids, topk_weights, scratch.get());
  if (fuses_at_any_decode_size()) {
    // Some T of this layer runs the fused decode kernel: once on the small copy too, on every SM.
    // At T = 1: one kernel serves every T, and the small copy needs no more shared memory than the
    // layer at any T.
    RunArgs one = args;
    one.num_tokens = 1;
    decode::launch(small, fused_launch(one, layout, nullptr, topk_ids, topk_weights), std::max(num_sms_, 1),
                   scratch.get());
  }
  HMOE_CUDA_CHECK(cudaStreamSynchronize(scratch.get()));
}

std::size_t MoeRunner::graph_count() const { return graphs_ != nullptr ? graphs_->graphs() : 0; }

PlanInfo MoeRunner::plan_info(int num_tokens) const {
  const int tokens = std::max(num_tokens, 1);
  const dispatch::Plan plan = dispatch::plan_for(spec_, std::min(tokens, chunk_tokens_), options_.orientation,
                                                   overrides_.get());
  PlanInfo info;
  info.orientation = plan.swap_ab ? Orientation::kSwapAB : Orientation::kNormal;
  info.token_tile = plan.token_tile;
  info.weight_tile = plan.gemm1->weight_tile;
  info.gemm1_kernel = plan.gemm1->name;
  info.gemm2_kernel = plan.gemm2->name;
  info.num_chunks = static_cast<int>((static_cast<long long>(tokens) + chunk_tokens_ - 1) / chunk_tokens_);
  info.source = plan.source;
  // As run_experts decides; fp8-tensor's depends on the run's scales, so both are told.
  info.fused_requant =
      gemm1_requant(spec_, *plan.gemm1, fused_requant_, static_requant_, /*static_scale=*/true).writes_fp8;
  info.gemm1_amax = gemm1_requant(spec_, *plan.gemm1, fused_requant_, static_requant_, /*static_scale=*/false).keeps_amax;
  const int max_tiles =
      max_token_tiles(static_cast<long long>(std::min(tokens, chunk_tokens_)) * spec_.top_k, spec_.num_experts,
                      plan.token_tile);
  const LayerSplits splits = layer_splits(spec_, options_, plan, max_tiles, num_sms_);
  info.gemm1_splits = splits.gemm1;
  info.gemm2_splits = splits.gemm2;
  const std::string_view fused_by = dispatch::fused_decode_source(
      spec_, options_, overrides_.get(), std::min(tokens, chunk_tokens_), dispatch::fused_decode_environment());
  if (!fused_by.empty()) {
    info.fused_decode = true;
    info.fused_requant = info.gemm1_amax = false;
    info.source = fused_by;
    info.gemm1_kernel = decode::kernel_name(spec_);
    info.gemm2_kernel.clear();
    info.gemm1_splits = info.gemm2_splits = 1;
  }
  return info;
}

void MoeRunner::check_args(const RunArgs& args) const {
  if (args.num_tokens < 0 || args.num_tokens > options_.max_tokens)
    throw Error("hmoe: RunArgs.num_tokens = " + std::to_string(args.num_tokens) + ": expected 0..max_tokens=" +
                std::to_string(options_.max_tokens));
  require_pointer(args.x, "RunArgs.x", 16);
  require_pointer(args.out, "RunArgs.out", 16);
  require_pointer(args.weights.w13, "RunArgs.weights.w13", 16);
  require_pointer(args.weights.w2, "RunArgs.weights.w2", 16);
  // Optional pointers: nullptr means zeros (correction_bias) or no counting (invalid_id_count).
  require_alignment(args.weights.correction_bias, "RunArgs.weights.correction_bias", 4);
  require_alignment(args.invalid_id_count, "RunArgs.invalid_id_count", 4);
  require_pointer(args.workspace, "RunArgs.workspace", 256);
  arguments::require_fp8_arguments(spec_, args.weights, args.act_scale, args.intermediate_act_scale,
                                   {"RunArgs", "RunArgs.weights.w13_scale", "RunArgs.weights.w2_scale",
                                    "RunArgs.act_scale", "RunArgs.intermediate_act_scale"});
  // A dynamic per-tensor scale is a property of the whole batch: it cannot be batch-invariant, and
  // chunks would each find their own (the intermediate's amax needs every chunk's GEMM1 first).
  const bool dynamic_tensor_scale = spec_.scheme == QuantScheme::kPerTensor &&
                                    (args.act_scale == nullptr || args.intermediate_act_scale == nullptr);
  if (dynamic_tensor_scale && spec_.batch_invariant)
    throw Error("hmoe: RunArgs.act_scale/intermediate_act_scale are null with MoeSpec.batch_invariant: fp8-tensor "
                "needs static activation scales for batch invariance (a dynamic scale depends on the whole batch)");
  if (dynamic_tensor_scale && args.num_tokens > chunk_tokens_)
    throw Error("hmoe: RunArgs.num_tokens = " + std::to_string(args.num_tokens) + " runs in chunks of " +
                std::to_string(chunk_tokens_) + " (PlanOptions.max_workspace_bytes) and RunArgs.act_scale/"
                "intermediate_act_scale are null: fp8-tensor's dynamic scales cover the whole batch, so chunked runs "
                "need static scales (or a workspace cap that fits every token)");
  if (args.workspace_size < workspace_bytes_)
    throw Error("hmoe: RunArgs.workspace_size = " + std::to_string(args.workspace_size) + ": expected at least " +
                std::to_string(workspace_bytes_) + " (MoeRunner::workspace_bytes())");
}

// Every argument is checked before the first chunk is enqueued, so a rejected call enqueues nothing.
void MoeRunner::run_from_logits(const RunArgs& args, const void* router_logits, cudaStream_t stream) const {
  check_args(args);
  const std::size_t logit_bytes = logits_element_bytes(spec_);
  require_pointer(router_logits, "router_logits", logit_bytes);
  const std::size_t tokens = args.num_tokens;
  const std::size_t row_bytes = static_cast<std::size_t>(spec_.hidden) * 2;
  const bool grouped = spec_.routing.function == RoutingFunction::kGroupedSigmoidTopK;
  require_disjoint({{"RunArgs.workspace", args.workspace, workspace_bytes_},
                    {"RunArgs.out", args.out, tokens * row_bytes},
                    {"RunArgs.x", args.x, tokens * row_bytes},
                    {"router_logits", router_logits, tokens * spec_.num_experts * logit_bytes},
                    {"RunArgs.weights.correction_bias", grouped ? args.weights.correction_bias : nullptr,
                     static_cast<std::size_t>(spec_.num_experts) * 4},
                    {"RunArgs.invalid_id_count", args.invalid_id_count, 4},
                    {"RunArgs.weights.w13_scale", args.weights.w13_scale, w13_scale_bytes_},
                    {"RunArgs.weights.w2_scale", args.weights.w2_scale, w2_scale_bytes_},
                    {"RunArgs.act_scale", args.act_scale, 4},
                    {"RunArgs.intermediate_act_scale", args.intermediate_act_scale, 4}});
  if (args.num_tokens == 0) return;
  enqueue_or_replay(graphs_.get(), 0, args, router_logits, nullptr, stream,
                    [&](cudaStream_t target) { enqueue_from_logits(args, router_logits, target); });
}

void MoeRunner::enqueue_from_logits(const RunArgs& args, const void* router_logits, cudaStream_t stream) const {
  const std::size_t logit_bytes = logits_element_bytes(spec_);
  const std::size_t row_bytes = static_cast<std::size_t>(spec_.hidden) * 2;
  const dispatch::WorkspaceLayout layout = dispatch::workspace_layout(spec_, chunk_tokens_);
  int* topk_ids = at<int>(args.workspace, layout.topk_ids);
  float* topk_weights = at<float>(args.workspace, layout.topk_weights);
  const int sms = num_sms_ > 0 ? num_sms_ : device_sm_count();   // 0: planned without a GPU
  for (int first = 0; first < args.num_tokens; first += chunk_tokens_) {
    RunArgs chunk = args;
    chunk.num_tokens = std::min(chunk_tokens_, args.num_tokens - first);
    chunk.x = advance(args.x, static_cast<std::size_t>(first) * row_bytes);
    chunk.out = at<void>(args.out, static_cast<std::size_t>(first) * row_bytes);
    const void* chunk_logits =
        advance(router_logits, static_cast<std::size_t>(first) * spec_.num_experts * logit_bytes);
    run_experts(chunk, topk_ids, topk_weights, sms, stream, chunk_logits);
  }
}

void MoeRunner::run_from_topk(const RunArgs& args, const std::int32_t* topk_ids, const float* topk_weights,
                              cudaStream_t stream) const {
  check_args(args);
  require_pointer(topk_ids, "topk_ids", 4);
  require_pointer(topk_weights, "topk_weights", 4);
  const std::size_t tokens = args.num_tokens;
  const std::size_t row_bytes = static_cast<std::size_t>(spec_.hidden) * 2;
  const std::size_t slot_bytes = static_cast<std::size_t>(spec_.top_k) * 4;
  require_disjoint({{"RunArgs.workspace", args.workspace, workspace_bytes_},
                    {"RunArgs.out", args.out, tokens * row_bytes},
                    {"RunArgs.x", args.x, tokens * row_bytes},
                    {"topk_ids", topk_ids, tokens * slot_bytes},
                    {"topk_weights", topk_weights, tokens * slot_bytes},
                    {"RunArgs.invalid_id_count", args.invalid_id_count, 4},
                    {"RunArgs.weights.w13_scale", args.weights.w13_scale, w13_scale_bytes_},
                    {"RunArgs.weights.w2_scale", args.weights.w2_scale, w2_scale_bytes_},
                    {"RunArgs.act_scale", args.act_scale, 4},
                    {"RunArgs.intermediate_act_scale", args.intermediate_act_scale, 4}});
  if (args.num_tokens == 0) return;
  enqueue_or_replay(graphs_.get(), 1, args, topk_ids, topk_weights, stream,
                    [&](cudaStream_t target) { enqueue_from_topk(args, topk_ids, topk_weights, target); });
}

void MoeRunner::enqueue_from_topk(const RunArgs& args, const std::int32_t* topk_ids, const float* topk_weights,
                                  cudaStream_t stream) const {
  const std::size_t row_bytes = static_cast<std::size_t>(spec_.hidden) * 2;
  const std::size_t slot_bytes = static_cast<std::size_t>(spec_.top_k) * 4;
  const int sms = num_sms_ > 0 ? num_sms_ : device_sm_count();
  for (int first = 0; first < args.num_tokens; first += chunk_tokens_) {
    RunArgs chunk = args;
    chunk.num_tokens = std::min(chunk_tokens_, args.num_tokens - first);
    chunk.x = advance(args.x, static_cast<std::size_t>(first) * row_bytes);
    chunk.out = at<void>(args.out, static_cast<std::size_t>(first) * row_bytes);
    const std::size_t slots_before = static_cast<std::size_t>(first) * slot_bytes;
    run_experts(chunk, advance(topk_ids, slots_before), advance(topk_weights, slots_before), sms, stream);
  }
}

bool MoeRunner::fused_decode(int num_tokens) const {
  const int environment = dispatch::fused_decode_environment();
  return !dispatch::fused_decode_source(spec_, options_, overrides_.get(), num_tokens, environment).empty();
}

bool MoeRunner::fuses_at_any_decode_size() const {
  return dispatch::fuses_at_any_decode_size(spec_, options_, overrides_.get(), chunk_tokens_,
                                            dispatch::fused_decode_environment());
}

// One chunk (the whole run when unchunked): [routing →] permute → GEMM1 → GEMM2 → combine, with its
// own plan, or the fused decode kernel. With router_logits the routing stage runs first and writes
// topk_ids / topk_weights (workspace pointers then).
void MoeRunner::run_experts(const RunArgs& args, const std::int32_t* topk_ids, const float* topk_weights,
                            int num_sms, cudaStream_t stream, const void* router_logits) const {
  const int tokens = args.num_tokens;
  if (fused_decode(tokens)) {
    const dispatch::WorkspaceLayout layout = dispatch::workspace_layout(spec_, chunk_tokens_);
    decode::launch(spec_, fused_launch(args, layout, router_logits, topk_ids, topk_weights), num_sms, stream);
    return;
  }
  const int entries = tokens * spec_.top_k;
  const dispatch::WorkspaceLayout layout = dispatch::workspace_layout(spec_, chunk_tokens_);
  const dispatch::Plan plan = dispatch::plan_for(spec_, tokens, options_.orientation, overrides_.get());

  permute::PermuteBuffers buffers;
  buffers.expert_counts = at<int>(args.workspace, layout.expert_counts);
  buffers.expert_cursor = at<int>(args.workspace, layout.expert_cursor);
  buffers.expert_offsets = at<int>(args.workspace, layout.expert_offsets);
  buffers.num_tiles = at<int>(args.workspace, layout.num_tiles);
  buffers.tiles = at<TokenTile>(args.workspace, layout.tiles);
  buffers.slot_rows = at<int>(args.workspace, layout.slot_rows);
  buffers.row_weights = at<float>(args.workspace, layout.row_weights);
  buffers.sorted_tokens = at<int>(args.workspace, layout.sorted_tokens);
  buffers.sorted_x = at<void>(args.workspace, layout.sorted_rows);
  const bool fp8 = spec_.weight_dtype == WeightDType::kFP8E4M3;
  const bool gemm_gathers = plan.gemm1->gather_tokens;
  const int max_tiles = max_token_tiles(entries, spec_.num_experts, plan.token_tile);
  const LayerSplits splits = layer_splits(spec_, options_, plan, max_tiles, num_sms);
  const int gemm1_splits = splits.gemm1, gemm2_splits = splits.gemm2;
  // Programmatic dependent launch (common/launch.cuh) where launch gaps matter: Swap-AB plans, the
  // decode sizes (−2.5 to −3.5 µs at T = 1 on H200); normal-orientation plans measured 1–2% slower
  // with it (docs/PERF.md, "PDL v1 and v2").
  const bool pdl = plan.swap_ab;
  float* split_partials = nullptr;
  int* split_counters = nullptr;
  if (gemm1_splits > 1 || gemm2_splits > 1) {
    split_partials = at<float>(args.workspace, layout.split_partials);
    split_counters = at<int>(args.workspace, layout.split_counters);
    buffers.zeroed.counters = split_counters;
    buffers.zeroed.counter_count = gemm::kSplitCounters;
  }
  float* x_scales = fp8 ? at<float>(args.workspace, layout.x_scales) : nullptr;
  float* intermediate_scales = fp8 ? at<float>(args.workspace, layout.intermediate_scales) : nullptr;
  const Gemm1Requant requant =
      gemm1_requant(spec_, *plan.gemm1, fused_requant_, static_requant_, args.intermediate_act_scale != nullptr);
  // Dynamic fp8-tensor scales: the amax slots of x and of the intermediate (GEMM1's epilogue keeps the amax
  // of its bf16 output there with requant.keeps_amax, gemm::GemmLaunch::out_amax, so the re-quantisation
  // reads that output once instead of twice; else the amax pass before it) are zeroed by the permute
  // stage's kernels, not by two memsets of their own.
  const bool permute_runs = !skips(kStagePermute);
  const bool tensor_scales = fp8 && spec_.scheme == QuantScheme::kPerTensor;
  if (permute_runs && tensor_scales && args.act_scale == nullptr) buffers.zeroed.amax[0] = x_scales + 1;
  if (permute_runs && tensor_scales && args.intermediate_act_scale == nullptr)
    buffers.zeroed.amax[1] = intermediate_scales + 1;
  // Prefill: x rows read once per token, not once per (token, slot) (permute::scatter_x_rows).
  const bool per_token = scatter_x_ && permute::scatter_x_rows(tokens, spec_.top_k);
  const permute::GatherX gather = gemm_gathers || fp8 ? permute::GatherX::kNone
                                  : per_token         ? permute::GatherX::kPerToken
                                                      : permute::GatherX::kPerRow;
  if (router_logits != nullptr && gather == permute::GatherX::kNone && permute::route_permute_applies(spec_, tokens) &&
      !skips(kStageRouting) && permute_runs) {
    // Decode sizes: routing and permute in one launch (the routing stage's bits, one kernel fewer).
    permute::launch_route_permute(spec_, router_logits, args.weights.correction_bias, tokens,
                                  at<int>(args.workspace, layout.topk_ids), at<float>(args.workspace, layout.topk_weights),
                                  plan.token_tile, buffers, args.invalid_id_count, stream);
  } else {
    if (router_logits != nullptr && !skips(kStageRouting))
      routing::launch_topk(spec_, router_logits, args.weights.correction_bias, tokens,
                           at<int>(args.workspace, layout.topk_ids), at<float>(args.workspace, layout.topk_weights),
                           stream);
    if (permute_runs)
      permute::launch_permute(topk_ids, topk_weights, args.x, tokens, spec_.top_k, spec_.num_experts, spec_.hidden,
                              plan.token_tile, gather, buffers, args.invalid_id_count, stream, pdl);
  }
  void* sorted_rows = buffers.sorted_x;
  // The valid expert-sorted rows: (token, slot) pairs with an id in [0, E).
  const int* valid_rows = buffers.expert_offsets + spec_.num_experts;
  // (a timing run that skips the permute stage zeroes GEMM1's slot itself, before the kernels)
  if (requant.keeps_amax && buffers.zeroed.amax[1] == nullptr)
    HMOE_CUDA_CHECK(cudaMemsetAsync(intermediate_scales + 1, 0, sizeof(float), stream));
  if (fp8) {
    // FP8: the gather quantises each x row into the sorted rows (one read of x, one e4m3 write).
    quant::ActivationRows rows;
    rows.source = args.x;
    rows.source_row = buffers.sorted_tokens;
    rows.num_rows = valid_rows;
    rows.max_rows = entries;
    rows.cols = spec_.hidden;
    rows.amax_rows = tokens;
    rows.amax_zeroed = buffers.zeroed.amax[0] != nullptr;
    // GEMM1 gathers the e4m3 rows itself: x quantised in token order, its scales per sorted row.
    if (per_token || gemm_gathers) {
      rows.slot_rows = buffers.slot_rows;
      rows.top_k = spec_.top_k;
      rows.tokens = tokens;
      rows.values_by_token = gemm_gathers;
    }
    if (!skips(kStageQuantizeX)) quant::launch_quantize_rows(spec_, rows, args.act_scale, buffers.sorted_x, x_scales, stream, pdl);
  }

  const WorkList work{buffers.num_tiles, buffers.tiles};
  void* intermediate = at<void>(args.workspace, layout.intermediate);

  gemm::GemmLaunch gemm1;
  // A gathering GEMM1 reads x's rows (FP8: x's e4m3 rows in token order) through the row → token index.
  gemm1.tokens = gemm_gathers && !fp8 ? args.x : buffers.sorted_x;
  gemm1.token_rows = gemm_gathers ? tokens : entries;
  gemm1.token_index = gemm_gathers ? buffers.sorted_tokens : nullptr;
  gemm1.sorted_rows = entries;
  gemm1.weights = args.weights.w13;
  gemm1.experts = spec_.num_experts;
  gemm1.weight_rows = 2 * spec_.intermediate;
  gemm1.k = spec_.hidden;
  gemm1.work = work;
  gemm1.max_tiles = max_tiles;
  gemm1.out = intermediate;
  gemm1.out_cols = spec_.intermediate;
  gemm1.num_sms = num_sms;
  gemm1.weight_scale = args.weights.w13_scale;
  gemm1.token_scale = x_scales;
  gemm1.per_row_scales = spec_.scheme == QuantScheme::kPerChannelPerToken;
  gemm1.splits = gemm1_splits;
  gemm1.split_partials = split_partials;
  gemm1.split_counters = split_counters;
  gemm1.pdl = pdl;
  // GEMM1's 256-row tiles write the SwiGLU output as GEMM2's e4m3 rows themselves, with 1×128 group
  // scales (fp8-block) or under the static scale (fp8-tensor; gemm::fuses_requant); every other FP8
  // GEMM1 stores it as bf16 for the separate pass below. Both round it to bf16 first, as the reference
  // does, and give the same bytes.
  const bool static_tensor_scale = spec_.scheme == QuantScheme::kPerTensor && args.intermediate_act_scale != nullptr;
  if (requant.writes_fp8) {
    gemm1.out = at<void>(args.workspace, layout.intermediate_fp8);
    if (static_tensor_scale) {
      gemm1.out_static_scale = args.intermediate_act_scale;
    } else {
      gemm1.out_scales = intermediate_scales;
      gemm1.ue8m0 = spec_.ue8m0_scales;
    }
  }
  if (requant.keeps_amax) gemm1.out_amax = intermediate_scales + 1;
  if (!skips(kStageGemm1)) plan.gemm1->launch(gemm1, stream);

  const void* gemm2_tokens = fp8 ? at<void>(args.workspace, layout.intermediate_fp8) : intermediate;
  if (fp8 && !requant.writes_fp8) {
    quant::ActivationRows rows;
    rows.source = intermediate;
    rows.num_rows = valid_rows;
    rows.max_rows = entries;
    rows.cols = spec_.intermediate;
    rows.amax_ready = requant.keeps_amax;
    rows.amax_zeroed = buffers.zeroed.amax[1] != nullptr;
    if (!skips(kStageRequantize))
      quant::launch_quantize_rows(spec_, rows, args.intermediate_act_scale, at<void>(args.workspace, layout.intermediate_fp8),
                                  intermediate_scales, stream, pdl);
  }

  // GEMM2 writes over the gathered x rows: GEMM1, earlier on the stream, no longer needs them.
  gemm::GemmLaunch gemm2 = gemm1;
  gemm2.tokens = gemm2_tokens;
  gemm2.token_rows = entries;
  gemm2.token_index = nullptr;
  gemm2.weights = args.weights.w2;
  gemm2.weight_rows = spec_.hidden;
  gemm2.k = spec_.intermediate;
  gemm2.out = sorted_rows;
  gemm2.out_cols = spec_.hidden;
  gemm2.row_weights = buffers.row_weights;
  gemm2.weight_scale = args.weights.w2_scale;
  // A static per-tensor scale fused into GEMM1 was written nowhere else: GEMM2 reads the caller's.
  gemm2.token_scale = requant.writes_fp8 && static_tensor_scale ? args.intermediate_act_scale : intermediate_scales;
  gemm2.out_scales = nullptr;   // (the GEMM1 epilogue's FP8 outputs only)
  gemm2.out_static_scale = nullptr;
  gemm2.out_amax = nullptr;
  gemm2.ue8m0 = false;
  gemm2.splits = gemm2_splits;
  if (!skips(kStageGemm2)) plan.gemm2->launch(gemm2, stream);

  if (!skips(kStageCombine))
    combine::launch_combine(sorted_rows, buffers.slot_rows, tokens, spec_.top_k, spec_.hidden, args.out, stream, pdl);
}

}  // namespace hmoe
