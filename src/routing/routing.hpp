// Router stage: logits [T, E] → top-k expert ids [T, k] int32 and weights [T, k] fp32 on the device.
#pragma once

#include <cuda_runtime_api.h>

#include "hmoe/hmoe.hpp"

namespace hmoe::routing {

// One warp per token. A token whose logits leave no valid choice (all NaN) gets id -1 in that
// slot, which the permute stage treats as an invalid id (contributes nothing, counted).
void launch_topk(const MoeSpec& spec, const void* logits, const float* correction_bias, int num_tokens,
                 int* topk_ids, float* topk_weights, cudaStream_t stream);

// Loads the kernel launch_topk would use for this spec (module loading is lazy), so the first run
// costs what later runs do.
void prepare(const MoeSpec& spec);

}  // namespace hmoe::routing
