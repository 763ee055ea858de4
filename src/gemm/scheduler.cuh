// Persistent tile scheduler: every CTA walks the (token tile × weight tile) work items of the
// device-side work list with a grid stride, so the launch is sized without knowing the routing.
#pragma once

#include "permute/work_list.hpp"

namespace hmoe::gemm {

struct WorkItem {
  TokenTile tokens;
  int weight_tile;
};

class PersistentScheduler {
 public:
  __device__ PersistentScheduler(const WorkList& work, int weight_tiles)
      : work_(work), weight_tiles_(weight_tiles), total_(*work.num_tiles * weight_tiles),
        next_(blockIdx.x) {}

  // NOTE: consecutive items share the token tile and walk its weight tiles, so at decode sizes the
  // CTAs of one wave stream disjoint weight rows of the same expert while its tokens stay in L2.
  __device__ bool next(WorkItem& item) {
    if (next_ >= total_) return false;
    item.tokens = work_.tiles[next_ / weight_tiles_];
    item.weight_tile = next_ % weight_tiles_;
    next_ += gridDim.x;
    return true;
  }

 private:
  WorkList work_;
  int weight_tiles_;
  int total_;
  int next_;
};

}  // namespace hmoe::gemm
