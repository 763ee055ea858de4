// An optional timeline of the expert GEMMs' work items, for a build configured with
// -DHMOE_GEMM_TRACE=ON (`hmoe trace`): when each CTA's producer got a free stage for each K block and
// when its consumer warpgroups started an item, had its first stage, finished its mainloop and its
// epilogue, in SM clock cycles. The default build compiles none of it into the kernels.
#pragma once

#include <cstdint>

namespace hmoe::gemm::trace {

#ifdef HMOE_GEMM_TRACE
inline constexpr bool kCompiled = true;
#else
inline constexpr bool kCompiled = false;
#endif

enum class Event : std::uint8_t {
  kStageIssued = 0,   // producer: a free stage for K block `k_block` of the item; its TMA loads go out now
  kItemStart = 1,     // consumer warpgroup: the scheduler handed it the item
  kFirstStage = 2,    // consumer warpgroup: the item's first stage has landed
  kMainloopEnd = 3,   // consumer warpgroup: the item's last wgmma batch retired (promoted, for FP8)
  kEpilogueEnd = 4,   // consumer warpgroup: the item's output is written (or handed to TMA)
};

// Who records: the producer, or consumer warpgroup 0 or 1. Each has its own region of the buffer.
inline constexpr int kRoles = 3;

struct Record {
  std::uint64_t clock;     // the SM's cycle counter (clock64): compare within one CTA only
  std::uint32_t item;      // the CTA's item count: 0 for its first work item, 1 for the next, ...
  std::uint16_t k_block;   // kStageIssued: the K block; else 0
  std::uint8_t event;      // Event
  std::uint8_t sm;         // the SM the CTA ran on (%smid)
};
static_assert(sizeof(Record) == 16, "records are written as two 8-byte words");

// Where a launch records: CTA b, role r writes its i-th record to
// records[(launch_slot · max_ctas · kRoles + b · kRoles + r) · per_role + i] while i < per_role, and
// its count to counts[(launch_slot · max_ctas + b) · kRoles + r] at the end.
struct Buffer {
  Record* records = nullptr;
  std::uint32_t* counts = nullptr;
  int per_role = 0;      // records a role keeps at most (later ones are counted, not kept)
  int max_ctas = 0;      // CTAs a launch may have at most (more are not recorded)
  int max_launches = 0;  // launches the buffer holds (later ones are not recorded)
};

// What one launch passes its kernel: a slot of the buffer, or records == nullptr (not tracing).
struct LaunchTrace {
  Record* records = nullptr;        // the slot's first record
  std::uint32_t* counts = nullptr;  // the slot's first count
  int per_role = 0;
  int max_ctas = 0;
};

// Host side (trace.cpp). While a buffer is set, every expert-GEMM launch takes the next slot and
// says which variant it was; clear() stops recording and returns how many launches were recorded.
void set_buffer(const Buffer& buffer);
int clear();
// The slot for the next launch of `variant` (records == nullptr when not tracing or full).
LaunchTrace next_launch(const char* variant, int grid);
// After clear(): the variant name and grid of recorded launch `slot`.
const char* launch_variant(int slot);
int launch_grid(int slot);

}  // namespace hmoe::gemm::trace
