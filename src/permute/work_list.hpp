// The device-side work list the permute stage builds and the GEMMs walk: expert-sorted token rows
// cut into tiles of one expert each, sized on the device so no host synchronisation is needed.
#pragma once

namespace hmoe {

// Rows [row_begin, row_end) of the expert-sorted token buffer, all routed to `expert`.
struct alignas(16) TokenTile {
  int expert;
  int row_begin;
  int row_end;
  int unused;
};

struct WorkList {
  const int* num_tiles = nullptr;       // device scalar, written by the permute stage
  const TokenTile* tiles = nullptr;     // [max_tiles]
};

// Largest number of tiles any routing of `entries` (token, slot) pairs over `experts` can need
// when each tile holds at most `token_tile` rows: Σ ceil(c_e / tile) over the experts with rows,
// < Σ (c_e / tile + 1) ≤ entries / tile + min(experts, entries); and no tile is empty, so at most
// `entries` (at T = 1: k tiles, not E).
inline int max_token_tiles(long long entries, int experts, int token_tile) {
  const long long bound = entries / token_tile + (entries < experts ? entries : experts);
  return static_cast<int>(bound < entries ? bound : entries);
}

}  // namespace hmoe
