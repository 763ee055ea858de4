// Host side of the optional GEMM timeline (trace.hpp): which buffer slot each launch records into.
#include "gemm/trace.hpp"

#include <mutex>
#include <string>
#include <vector>

namespace hmoe::gemm::trace {
namespace {

struct State {
  std::mutex mutex;
  Buffer buffer;
  bool active = false;
  std::vector<std::string> variants;   // per recorded launch
  std::vector<int> grids;
};

State& state() {
  static State instance;
  return instance;
}

}  // namespace

void set_buffer(const Buffer& buffer) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.buffer = buffer;
  s.active = buffer.records != nullptr && buffer.counts != nullptr && buffer.per_role > 0 && buffer.max_ctas > 0 &&
             buffer.max_launches > 0;
  s.variants.clear();
  s.grids.clear();
}

int clear() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.active = false;
  return static_cast<int>(s.variants.size());
}

LaunchTrace next_launch(const char* variant, int grid) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  LaunchTrace launch;
  if (!s.active || static_cast<int>(s.variants.size()) >= s.buffer.max_launches) return launch;
  const long long slot = static_cast<long long>(s.variants.size());
  s.variants.emplace_back(variant);
  s.grids.push_back(grid);
  const long long roles = static_cast<long long>(s.buffer.max_ctas) * kRoles;
  launch.records = s.buffer.records + slot * roles * s.buffer.per_role;
  launch.counts = s.buffer.counts + slot * roles;
  launch.per_role = s.buffer.per_role;
  launch.max_ctas = s.buffer.max_ctas;
  return launch;
}

const char* launch_variant(int slot) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return slot >= 0 && slot < static_cast<int>(s.variants.size()) ? s.variants[slot].c_str() : "";
}

int launch_grid(int slot) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return slot >= 0 && slot < static_cast<int>(s.grids.size()) ? s.grids[slot] : 0;
}

}  // namespace hmoe::gemm::trace
