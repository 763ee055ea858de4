// Builds TMA descriptors. cuTensorMapEncodeTiled is resolved through the CUDA runtime, so hmoe never
// links libcuda and its binaries start (and report "no GPU") on machines without a driver.
#include "gemm/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>

#include "common/cuda_check.hpp"
#include "gemm/config.hpp"

namespace hmoe::gemm {
namespace {

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

EncodeTiled tensor_map_encoder() {
  static const EncodeTiled encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    HMOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                     cudaEnableDefault, &query));
    if (query != cudaDriverEntryPointSuccess || function == nullptr)
      throw Error("hmoe: the CUDA driver does not provide cuTensorMapEncodeTiled (driver too old?)");
    return reinterpret_cast<EncodeTiled>(function);
  }();
  return encoder;
}

}  // namespace

void prepare_tensor_maps() { tensor_map_encoder(); }

CUtensorMap make_tensor_map(const void* base, long long rows, int cols, int box_rows, int element_bytes) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * element_bytes};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kTileRowBytes / element_bytes), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const bool fp8 = element_bytes == 1;
  const CUresult status = tensor_map_encoder()(
      &map, fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims,
      strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw Error("hmoe: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(static_cast<int>(status)) +
                ") for a [" + std::to_string(rows) + ", " + std::to_string(cols) + "] " + (fp8 ? "e4m3" : "bf16") +
                " matrix, box rows " + std::to_string(box_rows));
  return map;
}

}  // namespace hmoe::gemm
