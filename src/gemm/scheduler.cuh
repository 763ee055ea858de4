// Persistent tile scheduler: every CTA walks the (token tile × weight tile × K split) work items of
// the device-side work list with a grid stride, so the launch is sized without knowing the routing.
#pragma once

#include "gemm/work_order.hpp"
#include "permute/work_list.hpp"

namespace hmoe::gemm {

struct WorkItem {
  TokenTile tokens;
  int weight_tile;
  int output_tile;   // token tile index × weight tiles + weight tile: the split counter's index
  int split;         // which of the splits along K
  int k_begin;       // K blocks [k_begin, k_end) of this split
  int k_end;
};

class PersistentScheduler {
 public:
  // `token_group`: token tiles whose items interleave (below); 1 keeps each token tile's items together.
  __device__ PersistentScheduler(const WorkList& work, int weight_tiles, int splits, int k_blocks, int token_group)
      : work_(work), weight_tiles_(weight_tiles), splits_(splits), k_blocks_(k_blocks), token_group_(token_group),
        num_tiles_(*work.num_tiles), total_(num_tiles_ * weight_tiles * splits), next_(blockIdx.x) {}

  // Items run in groups of `token_group` consecutive token tiles: within a group the weight tile is
  // the outer index and the token tile the inner one, so the CTAs of one wave multiply each weight
  // tile by every token tile of the group at about the same time and it is read from DRAM once per
  // group rather than once per token tile (an expert whose weights exceed L2, as mixtral-8x7b's
  // 117 MB of e4m3 w13, was re-read for each of its token tiles; launch_expert_gemm groups only
  // such experts). NOTE: with a group of 1 consecutive items share the token tile and walk its
  // weight tiles, as at decode sizes, where each expert has one token tile: the CTAs of one wave
  // stream disjoint weight rows of the same expert while its tokens stay in L2. The splits of one
  // output tile are adjacent, so they run on different CTAs at the same time.
  __device__ bool next(WorkItem& item) {
    if (next_ >= total_) return false;
    const ItemTiles tiles = item_tiles(next_ / splits_, weight_tiles_, num_tiles_, token_group_);
    const int token_tile = tiles.token_tile;
    item.weight_tile = tiles.weight_tile;
    item.tokens = work_.tiles[token_tile];
    item.output_tile = token_tile * weight_tiles_ + item.weight_tile;
    item.split = next_ % splits_;
    item.k_begin = item.split * k_blocks_ / splits_;
    item.k_end = (item.split + 1) * k_blocks_ / splits_;
    next_ += gridDim.x;
    return true;
  }

 private:
  WorkList work_;
  int weight_tiles_;
  int splits_;
  int k_blocks_;
  int token_group_;
  int num_tiles_;
  int total_;
  int next_;
};

}  // namespace hmoe::gemm
