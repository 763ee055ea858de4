// How many MoE layers each preset's model has, for the model-level view of `hmoe bench --e2e`:
// the MoE share of one forward pass is that many times one layer. Kept beside the benchmarks, not
// in MoeSpec: a spec describes one layer, and the library never needs the model's depth.
#pragma once

#include <optional>
#include <string_view>

namespace hmoe::testkit {

// MoE layers of the model behind a preset of DESIGN.md §3 (tensor-parallel presets: the layers
// every rank runs), or nullopt for a name that is not a preset.
std::optional<int> moe_layers(std::string_view preset_name);

}  // namespace hmoe::testkit
