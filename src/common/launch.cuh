// Programmatic dependent launch (PDL) for the kernels of a layer. A kernel launched with
// launch_kernel(pdl = true) may start while the kernel before it on the stream still runs: its
// launch latency and set-up (the GEMMs' barrier initialisation) overlap that kernel's tail. Every
// kernel of a layer waits for the kernel before it to finish and flush (wait_for_previous_grid)
// before it touches memory, so the data dependence stays exact, and lets the next one launch
// (allow_dependents_to_launch) only once that wait is over (small kernels) or its last tile is done
// (the GEMMs). Both device calls are no-ops for a kernel launched without PDL. The runner asks for PDL
// on Swap-AB plans only (docs/PERF.md, "PDL v1 and v2"); HMOE_PDL=0 in the environment turns it off
// everywhere, for A/B timing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "common/cuda_check.hpp"
#include "common/environment.hpp"

namespace hmoe {

// False when HMOE_PDL=0 (read once per process).
inline bool pdl_allowed() {
  static const bool allowed = environment_switch_on("HMOE_PDL");
  return allowed;
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), with PDL when `pdl` (and pdl_allowed()).
// NOTE: the kernel must call wait_for_previous_grid() before its first global memory access. Launch
// errors are thrown here (cudaLaunchKernelEx returns them): no cudaGetLastError() after it.
template <typename... KernelParams, typename... Args>
void launch_kernel(bool pdl, void (*kernel)(KernelParams...), dim3 grid, dim3 block, std::size_t shared_bytes,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = pdl && pdl_allowed() ? 1 : 0;
  HMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Lets the next kernel of the stream launch once every CTA of this one has called it (or exited).
// It changes no ordering of memory: the next kernel still waits for this one to finish.
__device__ __forceinline__ void allow_dependents_to_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Blocks until the kernels before this one on the stream have finished and their writes are
// visible; returns at once for a kernel launched without PDL.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The top of a small kernel: wait for the kernel before, then let the next one launch. NOTE: the
// trigger comes after the wait so that at most one kernel launches ahead of the running one: with
// the trigger first, kernel N+2 could launch while N still ran and pack its CTAs onto the few SMs N
// had freed (measured slower on H200, docs/PERF.md "PDL v1 and v2").
__device__ __forceinline__ void pdl_start() {
  wait_for_previous_grid();
  allow_dependents_to_launch();
}

}  // namespace hmoe
