// The order in which the persistent GEMM scheduler takes its work items (PersistentScheduler), as a
// plain function so that host tests can check it is a permutation.
#pragma once

#include <cuda_runtime_api.h>

namespace hmoe::gemm {

struct ItemTiles {
  int token_tile;
  int weight_tile;
};

// The tiles of item `index` in [0, num_tiles · weight_tiles). With token_group == 1 consecutive items
// share the token tile and walk its weight tiles; with token_group = G > 1 the token tiles go in
// groups of G (the last may be shorter), and inside a group the weight tile is the outer index and
// the token tile the inner one. Every (token tile, weight tile) comes exactly once either way.
// NOTE: the grouped order's three more divisions an item cost the decode-size tiles ~2 % (measured
// on H200), so a group of one takes the plain arithmetic.
__host__ __device__ inline ItemTiles item_tiles(int index, int weight_tiles, int num_tiles, int token_group) {
  ItemTiles tiles{index / weight_tiles, index % weight_tiles};
  if (token_group > 1) {
    const int first = index / (token_group * weight_tiles) * token_group;   // the group's first token tile
    const int in_group = token_group < num_tiles - first ? token_group : num_tiles - first;
    const int local = index - first * weight_tiles;
    tiles.token_tile = first + local % in_group;
    tiles.weight_tile = local / in_group;
  }
  return tiles;
}

}  // namespace hmoe::gemm
