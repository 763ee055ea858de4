// The persistent GEMM scheduler's item order (src/gemm/work_order.hpp): whatever the grouping, every
// (token tile, weight tile) of a launch is taken exactly once, and the groups interleave as documented.
#include <gtest/gtest.h>

#include <vector>

#include "gemm/work_order.hpp"

namespace hmoe::gemm {
namespace {

TEST(WorkOrder, EveryTilePairExactlyOnceForEveryGrouping) {
  for (int num_tiles : {1, 2, 3, 7, 8, 9, 16, 17, 31}) {
    for (int weight_tiles : {1, 2, 3, 12, 56}) {
      for (int group = 1; group <= 9; ++group) {
        std::vector<int> seen(static_cast<std::size_t>(num_tiles * weight_tiles), 0);
        for (int index = 0; index < num_tiles * weight_tiles; ++index) {
          const ItemTiles tiles = item_tiles(index, weight_tiles, num_tiles, group);
          ASSERT_GE(tiles.token_tile, 0);
          ASSERT_LT(tiles.token_tile, num_tiles);
          ASSERT_GE(tiles.weight_tile, 0);
          ASSERT_LT(tiles.weight_tile, weight_tiles);
          ++seen[static_cast<std::size_t>(tiles.token_tile * weight_tiles + tiles.weight_tile)];
        }
        for (std::size_t pair = 0; pair < seen.size(); ++pair)
          ASSERT_EQ(seen[pair], 1) << "tiles " << num_tiles << " x " << weight_tiles << ", group " << group
                                   << ": pair " << pair;
      }
    }
  }
}

TEST(WorkOrder, GroupOfOneWalksEachTokenTilesWeightTiles) {
  for (int index = 0; index < 5 * 12; ++index) {
    const ItemTiles tiles = item_tiles(index, 12, 5, 1);
    EXPECT_EQ(tiles.token_tile, index / 12);
    EXPECT_EQ(tiles.weight_tile, index % 12);
  }
}

TEST(WorkOrder, GroupsPutTheTokenTileInnerAndShortenTheLastGroup) {
  // 10 token tiles in groups of 4: [0..3], [4..7], [8, 9]; 3 weight tiles.
  const std::vector<std::pair<int, int>> expected = {
      {0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1}, {0, 2}, {1, 2}, {2, 2}, {3, 2},
      {4, 0}, {5, 0}, {6, 0}, {7, 0}, {4, 1}, {5, 1}, {6, 1}, {7, 1}, {4, 2}, {5, 2}, {6, 2}, {7, 2},
      {8, 0}, {9, 0}, {8, 1}, {9, 1}, {8, 2}, {9, 2}};
  ASSERT_EQ(expected.size(), 30u);
  for (int index = 0; index < 30; ++index) {
    const ItemTiles tiles = item_tiles(index, 3, 10, 4);
    EXPECT_EQ(tiles.token_tile, expected[static_cast<std::size_t>(index)].first) << "item " << index;
    EXPECT_EQ(tiles.weight_tile, expected[static_cast<std::size_t>(index)].second) << "item " << index;
  }
}

}  // namespace
}  // namespace hmoe::gemm
