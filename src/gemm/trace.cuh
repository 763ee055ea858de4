// Device side of the optional GEMM timeline (trace.hpp): the producer's lane 0 and each consumer
// warpgroup's first thread record events. Without HMOE_GEMM_TRACE every call is empty and compiles to
// nothing. NOTE: the launch's slot is read from the kernel parameters at each record and at most a
// count lives in a register: a recorder object holding pointers across the mainloop made ptxas spill
// the 128×128 FP8 block kernels (56 bytes), a separate record count still 16-24.
#pragma once

#include <cstdint>

#include "gemm/trace.hpp"

namespace hmoe::gemm::trace {

// Records one event as record `index` of `role` (0 the producer, 1 + w consumer warpgroup w); one
// past the role's room is dropped. Call from the recording thread only.
__device__ __forceinline__ void record_at([[maybe_unused]] const LaunchTrace& launch, [[maybe_unused]] int role,
                                          [[maybe_unused]] std::uint32_t index, [[maybe_unused]] Event event,
                                          [[maybe_unused]] std::uint32_t item, [[maybe_unused]] int k_block = 0) {
  if constexpr (kCompiled) {
    if (launch.records == nullptr || static_cast<int>(blockIdx.x) >= launch.max_ctas ||
        index >= static_cast<std::uint32_t>(launch.per_role))
      return;
    std::uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned long long word = item | (static_cast<unsigned long long>(k_block & 0xffff) << 32) |
                                    (static_cast<unsigned long long>(event) << 48) |
                                    (static_cast<unsigned long long>(sm & 0xff) << 56);
    // 32-bit index arithmetic (a buffer holds < 2^32 records): fewer registers in tight kernels.
    const std::uint32_t slot = (blockIdx.x * kRoles + role) * static_cast<std::uint32_t>(launch.per_role) + index;
    *reinterpret_cast<ulonglong2*>(launch.records + slot) = make_ulonglong2(clock64(), word);
  }
}

// The producer: records at its running count (kept by the caller), which it then advances.
__device__ __forceinline__ void record([[maybe_unused]] const LaunchTrace& launch, [[maybe_unused]] int role,
                                       [[maybe_unused]] std::uint32_t& count, [[maybe_unused]] Event event,
                                       [[maybe_unused]] std::uint32_t item, [[maybe_unused]] int k_block = 0) {
  if constexpr (kCompiled) record_at(launch, role, count++, event, item, k_block);
}

// A consumer warpgroup's records sit at fixed places, four per item (start, first stage, mainloop
// end, epilogue end), so it keeps no count beside its item count (its kernels are at the register
// limit); an item with no epilogue of its own (split K) leaves a zero record, which readers skip.
__device__ __forceinline__ std::uint32_t consumer_slot(Event event, std::uint32_t item) {
  return 4 * item + (static_cast<std::uint32_t>(event) - static_cast<std::uint32_t>(Event::kItemStart));
}

// Writes how many records the role made (kept or not): once, after its last record.
__device__ __forceinline__ void finish([[maybe_unused]] const LaunchTrace& launch, [[maybe_unused]] int role,
                                       [[maybe_unused]] std::uint32_t count) {
  if constexpr (kCompiled) {
    if (launch.records == nullptr || static_cast<int>(blockIdx.x) >= launch.max_ctas) return;
    launch.counts[static_cast<long long>(blockIdx.x) * kRoles + role] = count;
  }
}

}  // namespace hmoe::gemm::trace
