// Host twin of the FP8 dispatch (launch_pack_rows_fp8, launch_unpack_fp8_rows), on the CPU
// reference's number formats: what the tests and the CPU simulation expect a row to become.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ep/config.hpp"
#include "reference/reference.hpp"

namespace hmoe::ep {

// bf16 row [hidden] → e4m3 values [hidden] and scales [hidden / 128]: per group scale =
// fp8_scale(amax, ue8m0), value = e4m3(v / scale).
inline void fp8_dispatch_quantize(const std::uint16_t* row, int hidden, bool ue8m0, std::uint8_t* values,
                                  float* scales) {
  for (int group = 0; group < hidden / kDispatchGroup; ++group) {
    const int first = group * kDispatchGroup;
    float amax = 0.0f;
    for (int c = first; c < first + kDispatchGroup; ++c)
      amax = std::max(amax, std::fabs(reference::bf16_to_float(row[c])));
    const float scale = reference::fp8_scale(amax, ue8m0);
    scales[group] = scale;
    for (int c = first; c < first + kDispatchGroup; ++c)
      values[c] = reference::float_to_e4m3(reference::bf16_to_float(row[c]) / scale);
  }
}

// e4m3 values and their group scales → bf16 row: bf16(float(value) × scale), nearest even.
inline void fp8_dispatch_dequantize(const std::uint8_t* values, const float* scales, int hidden, std::uint16_t* row) {
  for (int c = 0; c < hidden; ++c)
    row[c] = reference::float_to_bf16(reference::e4m3_to_float(values[c]) * scales[c / kDispatchGroup]);
}

}  // namespace hmoe::ep
