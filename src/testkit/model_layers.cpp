// The MoE layer count of each preset's model, from the models' published configurations.
#include "testkit/model_layers.hpp"

namespace hmoe::testkit {
namespace {

struct ModelDepth {
  std::string_view preset;
  int moe_layers;
};

constexpr ModelDepth kModelDepths[] = {
    {"mixtral-8x7b", 32},          // every one of the 32 layers is MoE
    {"qwen3-30b-a3b", 48},         // 48 layers, all MoE
    {"qwen3-235b-a22b-tp4", 94},   // 94 layers, all MoE
    {"deepseek-v3-tp8", 58},       // 61 layers, the first 3 dense (first_k_dense_replace = 3)
    {"olmoe-1b-7b", 16},           // 16 layers, all MoE
};

}  // namespace

std::optional<int> moe_layers(std::string_view preset_name) {
  for (const ModelDepth& depth : kModelDepths)
    if (depth.preset == preset_name) return depth.moe_layers;
  return std::nullopt;
}

}  // namespace hmoe::testkit
