// TMA descriptors for the expert GEMMs' operands (host side).
#pragma once

#include <cuda.h>

namespace hmoe::gemm {

// A row-major [rows, cols] matrix of bf16 (element_bytes 2) or e4m3 (1) read in boxes of one
// 128-byte row {128 / element_bytes columns, box_rows rows} with the 128-byte swizzle; reads past
// the matrix are zero-filled.
CUtensorMap make_tensor_map(const void* base, long long rows, int cols, int box_rows, int element_bytes);

// Resolves the driver's tensor-map encoder now rather than at the first launch.
void prepare_tensor_maps();

}  // namespace hmoe::gemm
