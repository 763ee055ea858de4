// The fused decode layer for fp8-tensor and fp8-channel weights (decode_layer.cuh).
#include "decode/decode_instances.cuh"

namespace hmoe::decode {
template void launch_scheme<Scheme::kTensor>(const KernelArgs*, int, int, std::size_t, cudaStream_t);
template void launch_scheme<Scheme::kChannel>(const KernelArgs*, int, int, std::size_t, cudaStream_t);
}  // namespace hmoe::decode
