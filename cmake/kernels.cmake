# Generates one translation unit per expert-GEMM variant, plus the list the registry is built from
# (src/gemm/variants.cpp), so a change to one variant rebuilds one file and builds parallelise.
# Each entry: name epilogue swap_ab token_tile weight_tile stages gather_tokens quant.
# quant: kNone (bf16), kEpilogueScale (fp8-tensor and fp8-channel), kBlockScale (fp8-block).
set(HMOE_GEMM_VARIANTS
  "swiglu_normal_t64_w128 kSwiGlu false 64 128 4 false kNone"
  "swiglu_normal_t64_w128_s3 kSwiGlu false 64 128 3 false kNone"
  "swiglu_normal_t128_w256 kSwiGlu false 128 256 4 false kNone"
  "swiglu_normal_t128_w256_gather kSwiGlu false 128 256 4 true kNone"
  "swiglu_swap_t8_w64 kSwiGlu true 8 64 8 false kNone"
  "swiglu_swap_t8_w64_gather kSwiGlu true 8 64 8 true kNone"
  "swiglu_swap_t16_w64 kSwiGlu true 16 64 8 false kNone"
  "swiglu_swap_t32_w64 kSwiGlu true 32 64 6 false kNone"
  "swiglu_swap_t64_w64 kSwiGlu true 64 64 5 false kNone"
  "swiglu_swap_t128_w64 kSwiGlu true 128 64 4 false kNone"
  "swiglu_swap_t16_w128 kSwiGlu true 16 128 8 false kNone"
  "swiglu_swap_t32_w128 kSwiGlu true 32 128 8 false kNone"
  "swiglu_swap_t64_w128 kSwiGlu true 64 128 6 false kNone"
  "weighted_normal_t64_w128 kRoutingWeight false 64 128 4 false kNone"
  "weighted_normal_t64_w128_s3 kRoutingWeight false 64 128 3 false kNone"
  "weighted_normal_t128_w256 kRoutingWeight false 128 256 4 false kNone"
  "weighted_normal_t128_w256_s3 kRoutingWeight false 128 256 3 false kNone"
  "weighted_swap_t8_w64 kRoutingWeight true 8 64 8 false kNone"
  "weighted_swap_t16_w64 kRoutingWeight true 16 64 8 false kNone"
  "weighted_swap_t32_w64 kRoutingWeight true 32 64 6 false kNone"
  "weighted_swap_t64_w64 kRoutingWeight true 64 64 5 false kNone"
  "weighted_swap_t128_w64 kRoutingWeight true 128 64 4 false kNone"
  "weighted_swap_t16_w128 kRoutingWeight true 16 128 8 false kNone"
  "weighted_swap_t32_w128 kRoutingWeight true 32 128 8 false kNone"
  "weighted_swap_t64_w128 kRoutingWeight true 64 128 6 false kNone"
  "swiglu_swap_t8_w64_fp8 kSwiGlu true 8 64 8 false kEpilogueScale"
  "swiglu_swap_t16_w64_fp8 kSwiGlu true 16 64 6 false kEpilogueScale"
  "swiglu_swap_t32_w64_fp8 kSwiGlu true 32 64 6 false kEpilogueScale"
  "swiglu_swap_t16_w128_fp8 kSwiGlu true 16 128 8 false kEpilogueScale"
  "swiglu_swap_t32_w128_fp8 kSwiGlu true 32 128 8 false kEpilogueScale"
  "swiglu_swap_t64_w128_fp8 kSwiGlu true 64 128 6 false kEpilogueScale"
  "swiglu_normal_t64_w128_fp8 kSwiGlu false 64 128 4 false kEpilogueScale"
  "swiglu_normal_t128_w128_fp8 kSwiGlu false 128 128 6 false kEpilogueScale"
  "swiglu_normal_t128_w256_fp8 kSwiGlu false 128 256 4 false kEpilogueScale"
  "swiglu_normal_t128_w256_fp8_gather kSwiGlu false 128 256 4 true kEpilogueScale"
  "weighted_swap_t8_w64_fp8 kRoutingWeight true 8 64 8 false kEpilogueScale"
  "weighted_swap_t16_w64_fp8 kRoutingWeight true 16 64 6 false kEpilogueScale"
  "weighted_swap_t32_w64_fp8 kRoutingWeight true 32 64 6 false kEpilogueScale"
  "weighted_swap_t16_w128_fp8 kRoutingWeight true 16 128 8 false kEpilogueScale"
  "weighted_swap_t32_w128_fp8 kRoutingWeight true 32 128 8 false kEpilogueScale"
  "weighted_swap_t64_w128_fp8 kRoutingWeight true 64 128 6 false kEpilogueScale"
  "weighted_normal_t64_w128_fp8 kRoutingWeight false 64 128 4 false kEpilogueScale"
  "weighted_normal_t64_w128_fp8_s3 kRoutingWeight false 64 128 3 false kEpilogueScale"
  "weighted_normal_t128_w128_fp8 kRoutingWeight false 128 128 6 false kEpilogueScale"
  "weighted_normal_t128_w256_fp8_s3 kRoutingWeight false 128 256 3 false kEpilogueScale"
  "swiglu_swap_t8_w64_fp8block kSwiGlu true 8 64 8 false kBlockScale"
  "swiglu_swap_t16_w64_fp8block kSwiGlu true 16 64 6 false kBlockScale"
  "swiglu_swap_t32_w64_fp8block kSwiGlu true 32 64 6 false kBlockScale"
  "swiglu_swap_t64_w64_fp8block kSwiGlu true 64 64 5 false kBlockScale"
  "swiglu_swap_t16_w128_fp8block kSwiGlu true 16 128 8 false kBlockScale"
  "swiglu_swap_t32_w128_fp8block kSwiGlu true 32 128 8 false kBlockScale"
  "swiglu_swap_t64_w128_fp8block kSwiGlu true 64 128 6 false kBlockScale"
  "swiglu_normal_t64_w64_fp8block kSwiGlu false 64 64 6 false kBlockScale"
  "swiglu_normal_t64_w128_fp8block kSwiGlu false 64 128 4 false kBlockScale"
  "swiglu_normal_t128_w128_fp8block kSwiGlu false 128 128 6 false kBlockScale"
  "swiglu_normal_t128_w256_fp8block kSwiGlu false 128 256 4 false kBlockScale"
  "swiglu_normal_t128_w256_fp8block_gather kSwiGlu false 128 256 4 true kBlockScale"
  "weighted_swap_t8_w64_fp8block kRoutingWeight true 8 64 8 false kBlockScale"
  "weighted_swap_t16_w64_fp8block kRoutingWeight true 16 64 6 false kBlockScale"
  "weighted_swap_t32_w64_fp8block kRoutingWeight true 32 64 6 false kBlockScale"
  "weighted_swap_t64_w64_fp8block kRoutingWeight true 64 64 5 false kBlockScale"
  "weighted_swap_t16_w128_fp8block kRoutingWeight true 16 128 8 false kBlockScale"
  "weighted_swap_t32_w128_fp8block kRoutingWeight true 32 128 8 false kBlockScale"
  "weighted_swap_t64_w128_fp8block kRoutingWeight true 64 128 6 false kBlockScale"
  "weighted_normal_t64_w64_fp8block kRoutingWeight false 64 64 6 false kBlockScale"
  "weighted_normal_t64_w128_fp8block kRoutingWeight false 64 128 4 false kBlockScale"
  "weighted_normal_t64_w128_fp8block_s3 kRoutingWeight false 64 128 3 false kBlockScale"
  "weighted_normal_t128_w128_fp8block kRoutingWeight false 128 128 6 false kBlockScale"
  "weighted_normal_t128_w256_fp8block_s3 kRoutingWeight false 128 256 3 false kBlockScale"
)

set(HMOE_GENERATED_DIR "${CMAKE_CURRENT_BINARY_DIR}/generated")
file(MAKE_DIRECTORY "${HMOE_GENERATED_DIR}")
set(HMOE_GENERATED_KERNELS "")
set(variant_list "")
foreach(entry IN LISTS HMOE_GEMM_VARIANTS)
  separate_arguments(fields UNIX_COMMAND "${entry}")
  list(GET fields 0 name)
  list(GET fields 1 epilogue)
  list(GET fields 2 swap_ab)
  list(GET fields 3 token_tile)
  list(GET fields 4 weight_tile)
  list(GET fields 5 stages)
  list(GET fields 6 gather)
  list(GET fields 7 quant)
  string(APPEND variant_list
         "HMOE_GEMM_VARIANT(${name}, ${epilogue}, ${swap_ab}, ${token_tile}, ${weight_tile}, ${stages}, ${gather}, ${quant})\n")
  set(source "${HMOE_GENERATED_DIR}/gemm_${name}.cu")
  set(content "// Generated by cmake/kernels.cmake: one expert-GEMM variant.\n#include \"gemm/kernel.cuh\"\n\nnamespace hmoe::gemm {\n\nusing Config = GemmConfig<EpilogueKind::${epilogue}, ${swap_ab}, ${token_tile}, ${weight_tile}, ${stages}, ${gather}, QuantKind::${quant}>;\nstatic_assert(Config::kSplitK == ${swap_ab}, \"the registry (variants.cpp) lists Swap-AB variants as the ones that split K\");\n\nvoid launch_${name}(const GemmLaunch& launch, cudaStream_t stream) { launch_expert_gemm<Config>(launch, stream, \"${name}\"); }\n\nvoid prepare_${name}() { ctas_per_sm<Config>(); }\n\n}  // namespace hmoe::gemm\n")
  # Rewrite only on change, so reconfiguring does not rebuild every kernel.
  if(EXISTS "${source}")
    file(READ "${source}" old_content)
  else()
    set(old_content "")
  endif()
  if(NOT old_content STREQUAL content)
    file(WRITE "${source}" "${content}")
  endif()
  list(APPEND HMOE_GENERATED_KERNELS "${source}")
endforeach()
set(list_file "${HMOE_GENERATED_DIR}/gemm_variants.inc")
if(EXISTS "${list_file}")
  file(READ "${list_file}" old_list)
else()
  set(old_list "")
endif()
if(NOT old_list STREQUAL variant_list)
  file(WRITE "${list_file}" "${variant_list}")
endif()
