// Persistent tile scheduler: every CTA walks the (token tile × weight tile × K split) work items of
// the device-side work list with a grid stride, so the launch is sized without knowing the routing.
#pragma once

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
  __device__ PersistentScheduler(const WorkList& work, int weight_tiles, int splits, int k_blocks)
      : work_(work), weight_tiles_(weight_tiles), splits_(splits), k_blocks_(k_blocks),
        total_(*work.num_tiles * weight_tiles * splits), next_(blockIdx.x) {}

  // NOTE: consecutive items share the token tile and walk its weight tiles, so at decode sizes the
  // CTAs of one wave stream disjoint weight rows of the same expert while its tokens stay in L2;
  // the splits of one output tile are adjacent, so they run on different CTAs at the same time.
  __device__ bool next(WorkItem& item) {
    if (next_ >= total_) return false;
    const int output_tile = next_ / splits_;
    item.tokens = work_.tiles[output_tile / weight_tiles_];
    item.weight_tile = output_tile % weight_tiles_;
    item.output_tile = output_tile;
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
  int total_;
  int next_;
};

}  // namespace hmoe::gemm
