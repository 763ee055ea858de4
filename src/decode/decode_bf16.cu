// The fused decode layer for bf16 weights (decode_layer.cuh).
#include "decode/decode_instances.cuh"

namespace hmoe::decode {
template void launch_scheme<Scheme::kBf16>(const KernelArgs*, int, int, std::size_t, cudaStream_t);
}  // namespace hmoe::decode
