// The fused decode layer for fp8-block weights (decode_layer.cuh).
#include "decode/decode_instances.cuh"

namespace hmoe::decode {
template void launch_scheme<Scheme::kBlock>(const KernelArgs*, int, int, std::size_t, cudaStream_t);
}  // namespace hmoe::decode
