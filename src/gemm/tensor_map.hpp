// TMA descriptors for the expert GEMMs' operands (host side).
#pragma once

#include <cuda.h>

namespace hmoe::gemm {

// A row-major [rows, cols] bf16 matrix read in boxes of {64 columns, box_rows rows} with the
// 128-byte swizzle; reads past the matrix are zero-filled.
CUtensorMap make_tensor_map(const void* base, long long rows, int cols, int box_rows);

// Resolves the driver's tensor-map encoder now rather than at the first launch.
void prepare_tensor_maps();

}  // namespace hmoe::gemm
