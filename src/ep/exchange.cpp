// NCCL groups of the expert-parallel layer (see exchange.hpp).
#include "ep/exchange.hpp"

#include <cstdint>
#include <string>

namespace hmoe::ep {

void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  throw Error(std::string("hmoe: NCCL error ") + std::to_string(static_cast<int>(status)) + " (" +
              ncclGetErrorString(status) + ") in " + call + " at " + file + ":" + std::to_string(line));
}

namespace {

// Posts body's calls as one NCCL group; the group is ended even when a call inside it fails, so
// NCCL's group depth stays balanced for the caller's error handling.
template <class Body>
void in_group(Body body) {
  HMOE_NCCL_CHECK(ncclGroupStart());
  try {
    body();
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  HMOE_NCCL_CHECK(ncclGroupEnd());
}

const std::uint8_t* byte_at(const void* base, std::size_t offset) {
  return static_cast<const std::uint8_t*>(base) + offset;
}
std::uint8_t* byte_at(void* base, std::size_t offset) { return static_cast<std::uint8_t*>(base) + offset; }

}  // namespace

void exchange_counts(int* counts, int world_size, ncclComm_t comm, cudaStream_t stream) {
  in_group([&] {
    for (int peer = 0; peer < world_size; ++peer) {
      HMOE_NCCL_CHECK(ncclSend(counts + peer, 1, ncclInt32, peer, comm, stream));
      HMOE_NCCL_CHECK(ncclRecv(counts + world_size + peer, 1, ncclInt32, peer, comm, stream));
    }
  });
}

void exchange_rows(const std::vector<RowArray>& arrays, const std::vector<int>& send_counts,
                   const std::vector<int>& send_offsets, const std::vector<int>& recv_counts,
                   const std::vector<int>& recv_offsets, ncclComm_t comm, cudaStream_t stream) {
  const int world_size = static_cast<int>(send_counts.size());
  in_group([&] {
    for (int peer = 0; peer < world_size; ++peer) {
      for (const RowArray& array : arrays) {
        if (send_counts[peer] > 0)
          HMOE_NCCL_CHECK(ncclSend(byte_at(array.send, send_offsets[peer] * array.row_bytes),
                                   send_counts[peer] * array.row_bytes, ncclUint8, peer, comm, stream));
        if (recv_counts[peer] > 0)
          HMOE_NCCL_CHECK(ncclRecv(byte_at(array.recv, recv_offsets[peer] * array.row_bytes),
                                   recv_counts[peer] * array.row_bytes, ncclUint8, peer, comm, stream));
      }
    }
  });
}

}  // namespace hmoe::ep
