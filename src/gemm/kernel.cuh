// One expert-GEMM kernel = mainloop + epilogue + persistent scheduler, and its host side in the
// four steps every hmoe kernel follows: check, pick the grid, build TMA descriptors, launch.
#pragma once

#include <algorithm>
#include <string>

#include "common/cuda_check.hpp"
#include "common/launch.cuh"
#include "gemm/config.hpp"
#include "gemm/epilogue.cuh"
#include "gemm/mainloop.cuh"
#include "gemm/scales.cuh"
#include "gemm/scheduler.cuh"
#include "gemm/split_k.cuh"
#include "gemm/tensor_map.hpp"
#include "gemm/trace.cuh"

#include <cutlass/arch/reg_reconfig.h>

namespace hmoe::gemm {

struct KernelArgs {
  CUtensorMap token_map;     // [token_rows, K], box {kBlockK, kTokenTile} ({kBlockK, 1} when gathering)
  CUtensorMap weight_map;    // [experts·weight_rows, K], box {kBlockK, kWeightTile}
  CUtensorMap out_map;       // Config::kTmaStore: the bf16 output [sorted_rows, out_cols], box {64, 64}
  WorkList work;
  const int* token_index;    // gathering variants only
  const std::uint8_t* tokens;  // Config::kGatherCpAsync: the token rows (x), `token_row_bytes` apart
  int token_row_bytes;
  int weight_tiles;
  int k_blocks;
  int splits;                // along K (Config::kSplitK variants; 1 otherwise)
  int token_group;           // token tiles whose items interleave (PersistentScheduler)
  EpilogueArgs epilogue;
  ScaleArgs scales;          // FP8 variants only
  SplitArgs split;           // splits > 1 only
#ifdef HMOE_GEMM_TRACE
  trace::LaunchTrace trace;  // the launch's slot of the timeline buffer (trace.hpp), or none
#endif
};

// The launch's timeline slot: none unless the build traces (trace.hpp). NOTE: a reference into the
// kernel parameters, so that the slot's fields are read from the constant bank where used rather than
// held in registers (the producer warpgroup has 40 of them).
#ifdef HMOE_GEMM_TRACE
__device__ __forceinline__ const trace::LaunchTrace& launch_trace(const KernelArgs& args) { return args.trace; }
#else
__device__ __forceinline__ trace::LaunchTrace launch_trace(const KernelArgs&) { return {}; }
#endif

// Token tiles the persistent scheduler interleaves at most (normal orientation): 8 tiles of 128 rows
// of a 4096-wide e4m3 K are 4 MB of L2, the weight tiles one wave reads beside them about as much.
inline constexpr int kMaxTokenGroup = 8;

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1) expert_gemm_kernel(const __grid_constant__ KernelArgs args) {
  extern __shared__ std::uint8_t dynamic_smem[];
  std::uint8_t* base = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(dynamic_smem) + 1023) & ~std::uintptr_t{1023});
  SharedStorage<Config> smem{base, reinterpret_cast<std::uint64_t*>(base + Config::kBarrierOffset), nullptr};
  smem.empty = smem.full + Config::kStages;

  if (threadIdx.x == 0) {
    for (int stage = 0; stage < Config::kStages; ++stage) {
      // The producer's arrival with the TMA bytes, and each gathering thread's cp.async arrival.
      ptx::Barrier::init(&smem.full[stage], 1 + Config::kGatherThreads);
      ptx::Barrier::init(&smem.empty[stage], 4 * Config::kConsumers);   // one arrival per consumer warp
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  // PDL: the set-up above overlapped the kernel before; the work list and token rows are its output.
  wait_for_previous_grid();

  PersistentScheduler scheduler(args.work, args.weight_tiles, args.splits, args.k_blocks, args.token_group);
  constexpr int kProducerThread = 128 * Config::kConsumers;
  if (threadIdx.x >= kProducerThread) {
    // NOTE: with two consumer warpgroups the 128×256 accumulators need more than the 170 registers
    // an even split of the file gives; the producer needs few, so it hands them over.
    if constexpr (Config::kConsumers == 2) cutlass::arch::warpgroup_reg_dealloc<40>();
    if constexpr (Config::kGatherCpAsync) {
      if (threadIdx.x == kProducerThread) cute::prefetch_tma_descriptor(&args.weight_map);
      produce_gathered<Config>(smem, &args.weight_map, args.tokens, args.token_row_bytes, args.token_index, scheduler,
                               args.epilogue.weight_rows, launch_trace(args));
    } else if (threadIdx.x / 32 == kProducerThread / 32) {
      if (threadIdx.x == kProducerThread) {
        cute::prefetch_tma_descriptor(&args.token_map);
        cute::prefetch_tma_descriptor(&args.weight_map);
      }
      produce<Config>(smem, &args.token_map, &args.weight_map, args.token_index, scheduler,
                      args.epilogue.weight_rows, launch_trace(args));
    }
    return;
  }
  if constexpr (Config::kConsumers == 2) cutlass::arch::warpgroup_reg_alloc<232>();
  PipelineState state;
  WorkItem item;
  float accumulator[Config::kTileN / 2];
  // The timeline (trace builds only): each consumer warpgroup's first thread records its items.
  [[maybe_unused]] std::uint32_t item_count = 0;
  const auto record = [&]([[maybe_unused]] trace::Event event, [[maybe_unused]] std::uint32_t item_index) {
    if constexpr (trace::kCompiled) {
      if (threadIdx.x % 128 == 0)
        trace::record_at(launch_trace(args), 1 + threadIdx.x / 128, trace::consumer_slot(event, item_index), event,
                         item_index);
    }
  };
  while (scheduler.next(item)) {
    const std::uint32_t item_index = item_count++;
    record(trace::Event::kItemStart, item_index);
    if constexpr (trace::kCompiled) {
      // Waiting on a barrier phase leaves it as it is: the mainloop's own wait then returns at once.
      if (threadIdx.x % 128 == 0) ptx::Barrier::wait(&smem.full[state.stage], state.phase);
      record(trace::Event::kFirstStage, item_index);
    }
    if constexpr (Config::kFp8Halves) {
      if constexpr (Config::kQuant == QuantKind::kBlockScale) {
        consume_promoted_halves<Config>(smem, state, item.k_begin, item.k_end, accumulator,
                                        BlockScales<Config>(item, args.scales));
      } else {
        consume_promoted_halves<Config>(smem, state, item.k_begin, item.k_end, accumulator, PlainPromotion<Config>{});
      }
    } else if constexpr (Config::kFp8 && !Config::kSwapAB && Config::kConsumers == 2) {
      if constexpr (Config::kQuant == QuantKind::kBlockScale) {
        consume_promoted_overlapped<Config>(smem, state, item.k_begin, item.k_end, accumulator,
                                            BlockScales<Config>(item, args.scales));
      } else {
        consume_promoted_overlapped<Config>(smem, state, item.k_begin, item.k_end, accumulator, PlainPromotion<Config>{});
      }
    } else if constexpr (Config::kQuant == QuantKind::kBlockScale) {
      consume_promoted<Config>(smem, state, item.k_begin, item.k_end, accumulator, BlockScales<Config>(item, args.scales));
    } else if constexpr (Config::kQuant == QuantKind::kEpilogueScale) {
      consume_promoted<Config>(smem, state, item.k_begin, item.k_end, accumulator, PlainPromotion<Config>{});
    } else {
      consume<Config>(smem, state, item.k_begin, item.k_end, accumulator);
    }
    record(trace::Event::kMainloopEnd, item_index);
    if constexpr (Config::kSplitK) {
      if (args.splits > 1 && !reduce_splits<Config>(accumulator, item, args.splits, args.split)) continue;
    }
    if constexpr (Config::kQuant == QuantKind::kEpilogueScale) apply_epilogue_scales<Config>(accumulator, item, args.scales);
    Epilogue<Config>::apply(accumulator, item, args.epilogue, StoreTarget{&args.out_map, smem.store_tile()});
    record(trace::Event::kEpilogueEnd, item_index);
  }
  if constexpr (trace::kCompiled) {
    if (threadIdx.x % 128 == 0) trace::finish(launch_trace(args), 1 + threadIdx.x / 128, 4 * item_count);
  }
  // The staged tile must stay until the last TMA store has read it.
  if constexpr (Config::kTmaStore) {
    if (threadIdx.x % 128 == 0) ptx::tma_store_wait_read();
  }
  // PDL: the next kernel may launch once every CTA has issued its last tile's stores. NOTE: not
  // earlier, or its CTAs would take the SMs this grid frees first, several to an SM, while others
  // idle (measured slower on H200: docs/PERF.md "PDL v1 and v2").
  allow_dependents_to_launch();
}

// The current device's L2 bytes, queried once (it only orders work items: PersistentScheduler).
inline long long l2_cache_bytes() {
  static const long long bytes = [] {
    int device = 0, value = 0;
    HMOE_CUDA_CHECK(cudaGetDevice(&device));
    HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrL2CacheSize, device));
    return static_cast<long long>(value);
  }();
  return bytes;
}

// CTAs of this variant that fit on one SM; the first call also raises the kernel's shared-memory
// limit and, with lazy module loading, loads the kernel (MoeRunner does it at plan time).
template <class Config>
int ctas_per_sm() {
  static const int ctas = [] {
    HMOE_CUDA_CHECK(cudaFuncSetAttribute(expert_gemm_kernel<Config>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Config::kSmemBytes));
    int blocks = 0;
    HMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, expert_gemm_kernel<Config>,
                                                                  Config::kThreads, Config::kSmemBytes));
    return blocks > 0 ? blocks : 1;
  }();
  return ctas;
}

template <class Config>
void launch_expert_gemm(const GemmLaunch& launch, cudaStream_t stream, const char* variant_name) {
  // 1. Preconditions (the dispatcher only picks variants whose constraints hold; re-checked cheaply).
  if (launch.k % 8 != 0 || launch.out_cols % 2 != 0)
    throw Error("hmoe: expert GEMM needs K % 8 == 0 and an even output width (K = " + std::to_string(launch.k) + ")");
  if (Config::kGatherTokens != (launch.token_index != nullptr))
    throw Error("hmoe: expert GEMM variant and launch disagree on gathering token rows");
  if (launch.sorted_rows <= 0 || (!Config::kGatherTokens && launch.sorted_rows != launch.token_rows))
    throw Error("hmoe: expert GEMM launched with " + std::to_string(launch.sorted_rows) + " expert-sorted rows for " +
                std::to_string(launch.token_rows) + " token rows (equal unless the variant gathers)");
  if (Config::kFp8 && (launch.weight_scale == nullptr || launch.token_scale == nullptr))
    throw Error("hmoe: FP8 expert GEMM launched without weight or token scales");
  if (Config::kQuant == QuantKind::kBlockScale && launch.k % kScaleGroup != 0)
    throw Error("hmoe: block-scaled expert GEMM needs K % 128 == 0 (K = " + std::to_string(launch.k) + ")");
  if (launch.out_scales != nullptr &&
      (!Config::kFusedRequant || Config::kQuant != QuantKind::kBlockScale || launch.out_cols % kScaleGroup != 0))
    throw Error(std::string("hmoe: expert GEMM ") + variant_name + " cannot write e4m3 output with group scales" +
                " (a 256-row block-scaled GEMM1 tile and an output width % 128 == 0 can; width " +
                std::to_string(launch.out_cols) + ")");
  if (launch.out_static_scale != nullptr &&
      (!Config::kFusedRequant || Config::kQuant != QuantKind::kEpilogueScale || launch.per_row_scales ||
       launch.out_cols % kScaleGroup != 0))
    throw Error(std::string("hmoe: expert GEMM ") + variant_name + " cannot write e4m3 output with a static scale" +
                " (a 256-row per-tensor GEMM1 tile and an output width % 128 == 0 can; width " +
                std::to_string(launch.out_cols) + ")");
  if (launch.out_amax != nullptr && (!Config::kKeepsAmax || launch.out_static_scale != nullptr))
    throw Error(std::string("hmoe: expert GEMM ") + variant_name + " cannot keep its output's amax" +
                " (GEMM1 tiles with per-tensor or per-row scales writing bf16 can)");
  const int weight_tiles = (launch.weight_rows + Config::kWeightTile - 1) / Config::kWeightTile;
  const int k_blocks = (launch.k + Config::kBlockK - 1) / Config::kBlockK;
  if (launch.splits != 1) {
    const long long output_tiles = static_cast<long long>(launch.max_tiles) * weight_tiles;
    if (!Config::kSplitK || launch.splits < 1 || launch.splits > k_blocks || launch.split_partials == nullptr ||
        launch.split_counters == nullptr || output_tiles > kSplitCounters ||
        output_tiles * launch.splits * Config::kTileFloats > kSplitPartialFloats)
      throw Error("hmoe: expert GEMM cannot split K " + std::to_string(launch.splits) + " ways here (K blocks " +
                  std::to_string(k_blocks) + ", output tiles " + std::to_string(output_tiles) + ")");
  }
  // 2. Grid: persistent, as many CTAs as fit on the chip but no more than there can be work items.
  const long long max_items = static_cast<long long>(launch.max_tiles) * weight_tiles * launch.splits;
  const int grid = static_cast<int>(std::min<long long>(max_items, static_cast<long long>(launch.num_sms) * ctas_per_sm<Config>()));
  if (grid <= 0) return;
  // 3. TMA descriptors.
  KernelArgs args;
  args.token_map = make_tensor_map(launch.tokens, launch.token_rows, launch.k,
                                   Config::kGatherTokens ? 1 : Config::kTokenTile, Config::kElementBytes);
  args.weight_map = make_tensor_map(launch.weights, static_cast<long long>(launch.experts) * launch.weight_rows,
                                    launch.k, Config::kWeightTile, Config::kElementBytes);
  args.work = launch.work;
  args.token_index = launch.token_index;
  args.tokens = static_cast<const std::uint8_t*>(launch.tokens);
  args.token_row_bytes = launch.k * Config::kElementBytes;
  args.weight_tiles = weight_tiles;
  args.k_blocks = k_blocks;
  args.splits = launch.splits;
  // Where one expert's weights would not stay in L2 while its token tiles pass (more than half of
  // it), as many token tiles as it has under even routing, at most kMaxTokenGroup, share each
  // weight tile's DRAM read. NOTE: grouping experts that fit in L2 measured 1-2.5 % slower
  // (qwen3-30b-a3b, deepseek-v3-tp8), and Swap-AB (decode) tiles have one token tile an expert.
  const long long expert_weight_bytes = static_cast<long long>(launch.weight_rows) * launch.k * Config::kElementBytes;
  const long long tiles_per_expert =
      (launch.sorted_rows / std::max(1, launch.experts) + Config::kTokenTile - 1) / Config::kTokenTile;
  args.token_group = !Config::kSwapAB && 2 * expert_weight_bytes > l2_cache_bytes()
                         ? static_cast<int>(std::clamp<long long>(tiles_per_expert, 1, kMaxTokenGroup))
                         : 1;
  args.split = SplitArgs{launch.split_partials, launch.split_counters};
  // NOTE: TMA needs 16-byte aligned rows; an output that has none keeps the direct stores.
  const bool tma_store = Config::kTmaStore && launch.out_cols % 8 == 0 &&
                         reinterpret_cast<std::uintptr_t>(launch.out) % 16 == 0;
  // e4m3 output (out_scales or out_static_scale set): boxes of 128 columns, still 128 bytes a row.
  const int out_bytes = launch.out_scales != nullptr || launch.out_static_scale != nullptr ? 1 : 2;
  if (tma_store) args.out_map = make_tensor_map(launch.out, launch.sorted_rows, launch.out_cols, 64, out_bytes);
  args.epilogue = EpilogueArgs{launch.out,         launch.out_cols, launch.weight_rows, launch.row_weights,
                               tma_store,          launch.out_scales, launch.ue8m0,
                               launch.out_amax,    launch.out_static_scale};
  args.scales = ScaleArgs{launch.weight_scale, launch.token_scale, launch.per_row_scales, launch.weight_rows,
                          launch.k / kScaleGroup};
#ifdef HMOE_GEMM_TRACE
  args.trace = trace::next_launch(variant_name, grid);
#endif
  // 4. Launch.
  launch_kernel(launch.pdl, expert_gemm_kernel<Config>, grid, Config::kThreads, Config::kSmemBytes, stream, args);
}

}  // namespace hmoe::gemm
