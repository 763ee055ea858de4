/* hmoe — plain C interface for FFI users (Python ctypes, Rust, Go...). It wraps the C++ API of
   hmoe.hpp one to one; every call returns a status, and hmoe_last_error() says why it failed. */
#ifndef HMOE_H_
#define HMOE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hmoe_status {
  HMOE_OK = 0,
  HMOE_INVALID_ARGUMENT = 1, /* a bad spec, size, pointer or option; the message names it */
  HMOE_CUDA_ERROR = 2,       /* a CUDA call failed (no device, launch failure, ...) */
  HMOE_INTERNAL_ERROR = 3
} hmoe_status;

/* Values mirror the C++ enums: weight_dtype 0 bf16, 1 fp8 e4m3; scheme 0 none, 1 per-tensor,
   2 per-channel × per-token, 3 128×128 block; routing_function 0 softmax top-k, 1 grouped sigmoid;
   logits_dtype 0 fp32, 1 bf16; orientation 0 auto, 1 normal, 2 swap-AB; matrix 0 w13, 1 w2.
   Fields added later sit at the end of their struct, so the offsets of older ones never move. */
typedef struct hmoe_spec {
  int num_experts, top_k, hidden, intermediate;
  int weight_dtype, scheme;
  int routing_function, renormalize, num_groups, topk_groups;
  float routed_scaling_factor;
  int logits_dtype;
  int batch_invariant;           /* nonzero: a token's output bits do not depend on the batch */
  int ue8m0_scales;              /* FP8 only, nonzero: computed scales rounded up to powers of two */
} hmoe_spec;

/* Zero-initialise it ({0} or memset): a zero in every field added later keeps that field's default. */
typedef struct hmoe_plan_options {
  int max_tokens;                /* largest T any run will pass */
  int orientation;               /* 0 auto, 1 normal, 2 swap-AB */
  size_t max_workspace_bytes;    /* 0: no cap; else runs are split into chunks that fit */
  int replay_graphs;             /* 1: replay whole layers as CUDA graphs from a key's second call
                                    (PlanOptions::replay_graphs: ~1.5 us of CPU per call instead of a
                                    launch per kernel); 0: launch the kernels every call */
  int no_warm_up;                /* 1: no plan-time warm-up (PlanOptions::warm_up off: the call creating
                                    the runner launches nothing); 0: warm up (the default) */
  int fused_decode;              /* T <= 4 as one fused kernel (PlanOptions::fused_decode): 0 auto (the
                                    default: where this device's tuned table says so), 1 on (wherever it
                                    applies), 2 off (never) */
} hmoe_plan_options;

typedef struct hmoe_run_args {
  int num_tokens;
  const void* x;                 /* [T, H] bf16, device */
  void* out;                     /* [T, H] bf16, device */
  const void* w13;               /* prepared, device */
  const void* w2;                /* prepared, device */
  const float* correction_bias;  /* [E] fp32 or NULL (grouped routing) */
  void* workspace;
  size_t workspace_size;
  int* invalid_id_count;         /* optional device counter */
  const float* w13_scale;        /* FP8 only: hmoe_weight_scale_count(spec, 0) floats, device */
  const float* w2_scale;         /* FP8 only: hmoe_weight_scale_count(spec, 1) floats, device */
  const float* act_scale;        /* fp8-tensor only: static scale of x, one float on the device, or NULL */
  const float* intermediate_act_scale; /* fp8-tensor only: static scale of the SwiGLU output, or NULL */
} hmoe_run_args;

typedef struct hmoe_runner hmoe_runner;

/* What a runner plans for a run of num_tokens tokens (MoeRunner::plan_info of hmoe.hpp; the plan of
   the first chunk when the run is chunked). Strings are NUL-terminated. */
typedef struct hmoe_plan_info {
  int orientation;               /* 1 normal, 2 swap-AB */
  int token_tile;                /* tokens per GEMM tile */
  int weight_tile;               /* weight rows per GEMM tile */
  int num_chunks;                /* runs of at most the runner's chunk size each */
  int gemm1_splits, gemm2_splits; /* ways each GEMM splits K over CTAs (1: not split) */
  int fused_decode;              /* 1: the whole layer is one kernel (gemm1_kernel names it, gemm2_kernel
                                    is ""); the tile fields are then the unfused plan's */
  char gemm1_kernel[64];
  char gemm2_kernel[64];
  char source[256];              /* who chose: "analytic", "tuned:<table file>", "forced",
                                    "batch-invariant"; for a fused plan "tuned:<file>", "option" or
                                    "environment" (docs/DISPATCH.md) */
} hmoe_plan_info;

/* The message of the last failed call on this thread ("" when none). */
const char* hmoe_last_error(void);

hmoe_status hmoe_spec_preset(const char* name, hmoe_spec* spec);
hmoe_status hmoe_prepared_weight_bytes(const hmoe_spec* spec, size_t* w13_bytes, size_t* w2_bytes);
hmoe_status hmoe_prepare_weights(const hmoe_spec* spec, const void* w13_src, const void* w2_src, void* w13_dst,
                                 void* w2_dst, void* stream);

/* FP8 weights. Scales are fp32 in the checkpoint layouts of matrix (0 w13 [E, 2I, H], 1 w2 [E, H, I];
   N rows, K columns): fp8-tensor [E], fp8-channel [E, N], fp8-block [E, ceil(N/128), ceil(K/128)].
   *count is 0 for bf16 specs. hmoe_quantize_weights turns bf16 weights [E, N, K] (device) into e4m3
   bytes of the same layout (what hmoe_prepare_weights takes for FP8 specs) and their scales. */
hmoe_status hmoe_weight_scale_count(const hmoe_spec* spec, int matrix, size_t* count);
hmoe_status hmoe_quantize_weights(const hmoe_spec* spec, int matrix, const void* bf16_weights, void* fp8_weights,
                                  float* scales, void* stream);

hmoe_status hmoe_runner_create(const hmoe_spec* spec, int max_tokens, int orientation, hmoe_runner** runner);
hmoe_status hmoe_runner_create_with_options(const hmoe_spec* spec, const hmoe_plan_options* options,
                                            hmoe_runner** runner);
void hmoe_runner_destroy(hmoe_runner* runner);
hmoe_status hmoe_runner_workspace_bytes(const hmoe_runner* runner, size_t* bytes);
/* num_tokens >= 1 (any count: larger ones report their chunking); works without a GPU. */
hmoe_status hmoe_runner_plan_info(const hmoe_runner* runner, int num_tokens, hmoe_plan_info* info);
hmoe_status hmoe_run_from_logits(const hmoe_runner* runner, const hmoe_run_args* args, const void* router_logits,
                                 void* stream);
hmoe_status hmoe_run_from_topk(const hmoe_runner* runner, const hmoe_run_args* args, const int32_t* topk_ids,
                               const float* topk_weights, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* HMOE_H_ */
