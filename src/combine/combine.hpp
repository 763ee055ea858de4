// Combine stage: out[t] = Σ_j y[slot_rows[t·k + j]] over the token's k slots, in slot order.
#pragma once

#include <cuda_runtime_api.h>

namespace hmoe::combine {

// y rows already carry the routing weight (GEMM2's epilogue). A slot with row -1 (invalid id)
// contributes nothing; a token with no valid slot gets zeros. Every element of out is written.
// pdl as in common/launch.cuh.
void launch_combine(const void* y, const int* slot_rows, int num_tokens, int top_k, int hidden, void* out,
                    cudaStream_t stream, bool pdl = false);

// Loads the stage's kernel (module loading is lazy), so the first run costs what later runs do.
void prepare();

}  // namespace hmoe::combine
