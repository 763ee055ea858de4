// Thin wrappers over the Hopper instructions the GEMM mainloop issues (TMA, mbarrier, wgmma
// descriptors). CUTLASS/CuTe supplies the wgmma instructions themselves (cute/arch).
#pragma once

#include <cuda.h>
#include <cstdint>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

namespace hmoe::ptx {

__device__ __forceinline__ std::uint32_t smem_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// A K-major operand tile in shared memory, rows of 64 bf16 (128 bytes) written by TMA with the
// 128-byte swizzle. NOTE: 8 rows form one 1024-byte swizzle atom, so the stride between 8-row
// groups is 1024 bytes; the leading offset is ignored for swizzled K-major layouts. Stepping K by
// 16 elements inside the 128-byte row adds 32 bytes to the start address (the swizzle is a
// function of the absolute address, hence tiles must be 1024-byte aligned).
__device__ __forceinline__ std::uint64_t sw128_kmajor_descriptor(const void* tile) {
  const std::uint32_t address = smem_address(tile);
  std::uint64_t descriptor = 0;
  descriptor |= static_cast<std::uint64_t>((address & 0x3FFFF) >> 4);
  descriptor |= static_cast<std::uint64_t>(1) << 16;
  descriptor |= static_cast<std::uint64_t>(1024 >> 4) << 32;
  descriptor |= static_cast<std::uint64_t>(1) << 62;
  return descriptor;
}

__device__ __forceinline__ void tma_load_2d(const CUtensorMap* map, std::uint64_t* barrier, void* destination,
                                            int column, int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];"
      :
      : "r"(smem_address(destination)), "l"(reinterpret_cast<std::uint64_t>(map)),
        "r"(smem_address(barrier)), "r"(column), "r"(row)
      : "memory");
}

// Copies 16 bytes from global to shared memory, of which only the first `source_bytes` (0..16) are
// read; the rest is zero-filled. Cached in L2 only, which fetches the 256 bytes around it from DRAM
// (as the TMA maps' L2 promotion does: a row's next K block is then an L2 hit). NOTE: a
// generic-proxy write, unlike TMA's.
__device__ __forceinline__ void cp_async_16_zfill(std::uint32_t destination, const void* source, int source_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;"
               :
               : "r"(destination), "l"(source), "r"(source_bytes)
               : "memory");
}
// One arrival on `barrier` once every cp.async this thread issued before has landed (.noinc: the
// arrival counts toward the barrier's expected arrivals, which must include it).
__device__ __forceinline__ void cp_async_arrive_noinc(std::uint64_t* barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" : : "r"(smem_address(barrier)) : "memory");
}

// Writes a box of shared memory (laid out as the map's swizzle says) to the map's tensor at
// {column, row}; parts of the box outside the tensor are not written. The store joins the thread's
// current bulk group (tma_store_commit).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* source, int column, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :
               : "l"(reinterpret_cast<std::uint64_t>(map)), "r"(smem_address(source)), "r"(column), "r"(row)
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" : : : "memory"); }
// Waits until the thread's committed bulk stores have read their shared memory (not until they land).
__device__ __forceinline__ void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" : : : "memory"); }
// Makes this thread's generic-proxy shared-memory writes visible to the async proxy (TMA).
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" : : : "memory"); }

// Waits until `threads` threads (a multiple of 32) of the CTA have reached barrier `id` (1..15;
// 0 is __syncthreads): a barrier among some warps only, such as the consumer warpgroups.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(threads) : "memory");
}

using Barrier = cutlass::arch::ClusterTransactionBarrier;

}  // namespace hmoe::ptx
