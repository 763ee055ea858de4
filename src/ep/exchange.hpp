// The NCCL side of the expert-parallel layer: the count exchange and the row exchanges, each one
// group of ncclSend/ncclRecv per peer (self included) on the caller's stream.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <vector>

#include "hmoe/hmoe.hpp"

namespace hmoe::ep {

[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line);

#define HMOE_NCCL_CHECK(call)                                                     \
  do {                                                                            \
    const ncclResult_t hmoe_nccl_status_ = (call);                                \
    if (hmoe_nccl_status_ != ncclSuccess)                                         \
      ::hmoe::ep::throw_nccl_error(hmoe_nccl_status_, #call, __FILE__, __LINE__); \
  } while (0)

// counts[0, R) (this rank's send counts) go out, one int to each rank; counts[R, 2R) receive what
// each rank sends here.
void exchange_counts(int* counts, int world_size, ncclComm_t comm, cudaStream_t stream);

// One array of rows that travels in an exchange: row i of the send side is row_bytes at
// send + i·row_bytes, received rows land at recv + i·row_bytes.
struct RowArray {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t row_bytes = 0;
};

// Rows [send_offsets[q], +send_counts[q]) of every array go to rank q; rows from rank q land at
// [recv_offsets[q], +recv_counts[q]). Host counts (they size the NCCL calls); empty blocks post
// nothing, on both sides alike, because rank q's send count to r is r's receive count from q.
void exchange_rows(const std::vector<RowArray>& arrays, const std::vector<int>& send_counts,
                   const std::vector<int>& send_offsets, const std::vector<int>& recv_counts,
                   const std::vector<int>& recv_offsets, ncclComm_t comm, cudaStream_t stream);

}  // namespace hmoe::ep
