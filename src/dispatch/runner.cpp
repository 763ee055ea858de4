// MoeRunner: validates once at plan time and cheaply at each run, then enqueues the stages
// routing → permute → GEMM1 (SwiGLU) → GEMM2 (× routing weight) → combine on the caller's stream.
#include <cstdint>
#include <sstream>

#include "combine/combine.hpp"
#include "common/cuda_check.hpp"
#include "dispatch/plan.hpp"
#include "hmoe/hmoe.hpp"
#include "permute/permute.hpp"
#include "routing/routing.hpp"

namespace hmoe {
namespace {

constexpr int kMaxTokens = 1 << 20;

template <typename T>
T* at(void* workspace, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<std::uint8_t*>(workspace) + offset);
}

void require_pointer(const void* pointer, const char* name, std::size_t alignment) {
  if (pointer == nullptr) throw Error(std::string("hmoe: ") + name + " is null");
  if (reinterpret_cast<std::uintptr_t>(pointer) % alignment != 0) {
    std::ostringstream message;
    message << "hmoe: " << name << " = " << pointer << " is not " << alignment << "-byte aligned";
    throw Error(message.str());
  }
}

int device_sm_count() {
  int device = 0;
  HMOE_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0;
  HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace

MoeRunner::MoeRunner(const MoeSpec& spec, const PlanOptions& options) : spec_(spec), options_(options) {
  validate(spec_);
  if (options.max_tokens < 1 || options.max_tokens > kMaxTokens)
    throw Error("hmoe: invalid PlanOptions.max_tokens = " + std::to_string(options.max_tokens) + ": expected 1.." +
                std::to_string(kMaxTokens));
  workspace_bytes_ = dispatch::workspace_layout(spec_, options.max_tokens).total;
}

PlanInfo MoeRunner::plan_info(int num_tokens) const {
  const dispatch::Plan plan = dispatch::choose_plan(spec_, std::max(num_tokens, 1), options_.orientation);
  PlanInfo info;
  info.orientation = plan.swap_ab ? Orientation::kSwapAB : Orientation::kNormal;
  info.token_tile = plan.token_tile;
  info.weight_tile = plan.gemm1->weight_tile;
  info.gemm1_kernel = plan.gemm1->name;
  info.gemm2_kernel = plan.gemm2->name;
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
  require_pointer(args.workspace, "RunArgs.workspace", 256);
  if (args.workspace_size < workspace_bytes_)
    throw Error("hmoe: RunArgs.workspace_size = " + std::to_string(args.workspace_size) + ": expected at least " +
                std::to_string(workspace_bytes_) + " (MoeRunner::workspace_bytes())");
}

void MoeRunner::run_from_logits(const RunArgs& args, const void* router_logits, cudaStream_t stream) const {
  check_args(args);
  require_pointer(router_logits, "router_logits", 4);
  if (args.num_tokens == 0) return;
  const dispatch::WorkspaceLayout layout = dispatch::workspace_layout(spec_, options_.max_tokens);
  int* topk_ids = at<int>(args.workspace, layout.topk_ids);
  float* topk_weights = at<float>(args.workspace, layout.topk_weights);
  routing::launch_topk(spec_, router_logits, args.weights.correction_bias, args.num_tokens, topk_ids, topk_weights,
                       stream);
  run_experts(args, topk_ids, topk_weights, stream);
}

void MoeRunner::run_from_topk(const RunArgs& args, const std::int32_t* topk_ids, const float* topk_weights,
                              cudaStream_t stream) const {
  check_args(args);
  require_pointer(topk_ids, "topk_ids", 4);
  require_pointer(topk_weights, "topk_weights", 4);
  if (args.num_tokens == 0) return;
  run_experts(args, topk_ids, topk_weights, stream);
}

void MoeRunner::run_experts(const RunArgs& args, const std::int32_t* topk_ids, const float* topk_weights,
                            cudaStream_t stream) const {
  const int tokens = args.num_tokens;
  const int entries = tokens * spec_.top_k;
  const dispatch::WorkspaceLayout layout = dispatch::workspace_layout(spec_, options_.max_tokens);
  const dispatch::Plan plan = dispatch::choose_plan(spec_, tokens, options_.orientation);

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
  permute::launch_permute(topk_ids, topk_weights, args.x, tokens, spec_.top_k, spec_.num_experts, spec_.hidden,
                          plan.token_tile, buffers, args.invalid_id_count, stream);
  void* sorted_rows = buffers.sorted_x;

  const int sms = device_sm_count();
  const WorkList work{buffers.num_tiles, buffers.tiles};
  const int max_tiles = max_token_tiles(entries, spec_.num_experts, plan.token_tile);
  void* intermediate = at<void>(args.workspace, layout.intermediate);

  gemm::GemmLaunch gemm1;
  gemm1.tokens = buffers.sorted_x;
  gemm1.token_rows = entries;
  gemm1.weights = args.weights.w13;
  gemm1.experts = spec_.num_experts;
  gemm1.weight_rows = 2 * spec_.intermediate;
  gemm1.k = spec_.hidden;
  gemm1.work = work;
  gemm1.max_tiles = max_tiles;
  gemm1.out = intermediate;
  gemm1.out_cols = spec_.intermediate;
  gemm1.num_sms = sms;
  plan.gemm1->launch(gemm1, stream);

  // GEMM2 writes over the gathered x rows: GEMM1, earlier on the stream, no longer needs them.
  gemm::GemmLaunch gemm2 = gemm1;
  gemm2.tokens = intermediate;
  gemm2.weights = args.weights.w2;
  gemm2.weight_rows = spec_.hidden;
  gemm2.k = spec_.intermediate;
  gemm2.out = sorted_rows;
  gemm2.out_cols = spec_.hidden;
  gemm2.row_weights = buffers.row_weights;
  plan.gemm2->launch(gemm2, stream);

  combine::launch_combine(sorted_rows, buffers.slot_rows, tokens, spec_.top_k, spec_.hidden, args.out, stream);
}

}  // namespace hmoe
