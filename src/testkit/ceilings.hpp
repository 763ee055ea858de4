// The hardware ceilings DESIGN.md §4 judges speed against, measured on the card in use (never
// taken from a datasheet): memory bandwidth two ways, and dense bf16 tensor-core throughput.
#pragma once

#include <algorithm>

namespace hmoe::testkit {

struct Ceilings {
  double copy_gb_per_s = 0.0;         // large device-to-device copy, read + write bytes
  double read_gb_per_s = 0.0;         // large read-only reduction
  double bf16_gemm_tflop_per_s = 0.0; // cuBLAS bf16 GEMM 8192³, fp32 accumulation

  // Weight streaming is read-only and can beat the copy figure: the floor uses the higher.
  double bandwidth_gb_per_s() const { return std::max(copy_gb_per_s, read_gb_per_s); }
};

// Measured on the first call (a second or two), then cached for the process.
const Ceilings& measured_ceilings();

// Dense FP8 (e4m3) tensor-core throughput: cuBLASLt GEMM 8192³, TN layout, per-tensor A and B
// scales, bf16 output, fp32 accumulation with cuBLASLt's fast-accumulation mode. Measured on the
// first call, then cached. Kept apart from measured_ceilings(): only FP8 floors and
// `hmoe bench --ceilings` need it, and bf16 benchmarks should not pay for it.
double measured_fp8_gemm_tflop_per_s();

}  // namespace hmoe::testkit
