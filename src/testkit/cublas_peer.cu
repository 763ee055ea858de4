// CublasExpertLoop: rows sorted by expert (x already permuted), cublasGemmEx per expert in the
// "TN" arrangement cuBLAS runs fastest (both operands contiguous along K), SwiGLU in one launch.
#include "testkit/cublas_peer.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "testkit/cublas_check.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/random_inputs.hpp"

namespace hmoe::testkit {
namespace {

constexpr std::uint64_t kSaltW13 = 0x70313;    // the peer's own weights, not hmoe's salts
constexpr std::uint64_t kSaltW2 = 0x702;
constexpr std::uint64_t kSaltX = 0x7078;
// NOTE: cuBLAS must not allocate during graph capture; a workspace set up front avoids it.
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;
constexpr int kSwigluThreads = 256;
constexpr int kVector = 8;  // bf16 per 16-byte load; I is a multiple of 64

// act[r, c] = silu(gate[r, c]) * up[r, c], with gate = h[r, 0:I] and up = h[r, I:2I].
__global__ void swiglu_kernel(const __nv_bfloat16* h, __nv_bfloat16* act, std::size_t rows, int intermediate) {
  const std::size_t vectors_per_row = intermediate / kVector;
  const std::size_t count = rows * vectors_per_row;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const std::size_t row = i / vectors_per_row;
    const std::size_t column = (i % vectors_per_row) * kVector;
    const __nv_bfloat16* gate_row = h + row * 2 * intermediate;
    const uint4 gate_bits = *reinterpret_cast<const uint4*>(gate_row + column);
    const uint4 up_bits = *reinterpret_cast<const uint4*>(gate_row + intermediate + column);
    const __nv_bfloat162* gate = reinterpret_cast<const __nv_bfloat162*>(&gate_bits);
    const __nv_bfloat162* up = reinterpret_cast<const __nv_bfloat162*>(&up_bits);
    uint4 result_bits;
    __nv_bfloat162* result = reinterpret_cast<__nv_bfloat162*>(&result_bits);
    for (int pair = 0; pair < kVector / 2; ++pair) {
      const float2 g = __bfloat1622float2(gate[pair]);
      const float2 u = __bfloat1622float2(up[pair]);
      result[pair] = __floats2bfloat162_rn(g.x / (1.0f + __expf(-g.x)) * u.x, g.y / (1.0f + __expf(-g.y)) * u.y);
    }
    *reinterpret_cast<uint4*>(act + row * intermediate + column) = result_bits;
  }
}

}  // namespace

struct CublasExpertLoop::State {
  MoeSpec spec;
  std::uint64_t seed = 0;
  DeviceBuffer w13;  // [E, 2I, H] bf16
  DeviceBuffer w2;   // [E, H, I] bf16
  DeviceBuffer cublas_workspace;
  cublasHandle_t handle = nullptr;
  Stream stream;
};

CublasExpertLoop::CublasExpertLoop(const MoeSpec& spec, std::uint64_t seed) : state_(std::make_unique<State>()) {
  validate(spec);
  State& state = *state_;
  state.spec = spec;
  state.seed = seed;
  const std::size_t experts = spec.num_experts;
  const std::size_t w13_count = experts * 2 * spec.intermediate * spec.hidden;
  const std::size_t w2_count = experts * spec.hidden * spec.intermediate;
  state.w13 = DeviceBuffer(w13_count * sizeof(std::uint16_t));
  state.w2 = DeviceBuffer(w2_count * sizeof(std::uint16_t));
  state.cublas_workspace = DeviceBuffer(kCublasWorkspaceBytes);
  const cudaStream_t stream = state.stream.get();
  fill_uniform_bf16(state.w13.as<std::uint16_t>(), w13_count, 1.0f / std::sqrt(static_cast<float>(spec.hidden)),
                    seed, kSaltW13, stream);
  fill_uniform_bf16(state.w2.as<std::uint16_t>(), w2_count, 1.0f / std::sqrt(static_cast<float>(spec.intermediate)),
                    seed, kSaltW2, stream);
  state.stream.synchronize();
  HMOE_CUBLAS_CHECK(cublasCreate(&state.handle));
  HMOE_CUBLAS_CHECK(cublasSetStream(state.handle, stream));
  HMOE_CUBLAS_CHECK(cublasSetWorkspace(state.handle, state.cublas_workspace.get(), kCublasWorkspaceBytes));
}

CublasExpertLoop::~CublasExpertLoop() {
  if (state_ && state_->handle != nullptr) cublasDestroy(state_->handle);
}

PeerRow CublasExpertLoop::bench(int num_tokens, const std::vector<std::vector<int>>& tokens_per_expert,
                                double seconds_per_point, int min_replays) const {
  const State& state = *state_;
  const MoeSpec& spec = state.spec;
  if (num_tokens < 1) throw Error("hmoe testkit: CublasExpertLoop::bench needs num_tokens >= 1");
  if (tokens_per_expert.empty()) throw Error("hmoe testkit: CublasExpertLoop::bench needs the expert load of >= 1 input set");
  const std::size_t rows = static_cast<std::size_t>(num_tokens) * spec.top_k;
  for (const std::vector<int>& load : tokens_per_expert) {
    if (load.size() != static_cast<std::size_t>(spec.num_experts))
      throw Error("hmoe testkit: CublasExpertLoop::bench: an expert load has " + std::to_string(load.size()) +
                  " entries, expected E = " + std::to_string(spec.num_experts));
    const long long total = std::accumulate(load.begin(), load.end(), 0LL);
    if (total < 0 || static_cast<std::size_t>(total) > rows)
      throw Error("hmoe testkit: CublasExpertLoop::bench: an expert load sums to " + std::to_string(total) +
                  ", expected at most T x k = " + std::to_string(rows));
  }
  const cudaStream_t stream = state.stream.get();
  const std::size_t hidden = spec.hidden;
  const std::size_t intermediate = spec.intermediate;

  // Intermediates are shared by the sets (their graphs run one after another on one stream); each
  // set has its own x, already in expert order (the gather is not part of what is timed).
  DeviceBuffer h(rows * 2 * intermediate * sizeof(std::uint16_t));
  DeviceBuffer act(rows * intermediate * sizeof(std::uint16_t));
  DeviceBuffer out(rows * hidden * sizeof(std::uint16_t));
  std::vector<DeviceBuffer> xs;
  for (std::size_t set = 0; set < tokens_per_expert.size(); ++set) {
    xs.emplace_back(rows * hidden * sizeof(std::uint16_t));
    fill_uniform_bf16(xs.back().as<std::uint16_t>(), rows * hidden, 1.0f, state.seed + 1 + set, kSaltX, stream);
  }
  const auto* w13 = state.w13.as<const __nv_bfloat16>();
  const auto* w2 = state.w2.as<const __nv_bfloat16>();
  const float alpha = 1.0f;
  const float beta = 0.0f;

  auto enqueue_layer = [&](const std::vector<int>& load, const DeviceBuffer& x) {
    // Column-major view: a row-major [n × K] matrix is K × n with leading dimension K.
    // GEMM1: h_e [n × 2I] = x_e [n × H] · w13_eᵀ → (2I × n) = (w13_e: H × 2I)ᵀ · (x_e: H × n).
    std::size_t row = 0;
    for (int expert = 0; expert < spec.num_experts; ++expert) {
      const int n = load[expert];
      if (n > 0) {
        HMOE_CUBLAS_CHECK(cublasGemmEx(state.handle, CUBLAS_OP_T, CUBLAS_OP_N, 2 * spec.intermediate, n, spec.hidden,
                                       &alpha, w13 + expert * 2 * intermediate * hidden, CUDA_R_16BF, spec.hidden,
                                       x.as<const __nv_bfloat16>() + row * hidden, CUDA_R_16BF, spec.hidden, &beta,
                                       h.as<__nv_bfloat16>() + row * 2 * intermediate, CUDA_R_16BF,
                                       2 * spec.intermediate, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      row += n;
    }
    const std::size_t work = row * (intermediate / kVector);
    if (work > 0) {
      const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>((work + kSwigluThreads - 1) / kSwigluThreads, 65536));
      swiglu_kernel<<<blocks, kSwigluThreads, 0, stream>>>(h.as<const __nv_bfloat16>(), act.as<__nv_bfloat16>(), row,
                                                           spec.intermediate);
      HMOE_CUDA_CHECK(cudaGetLastError());
    }
    // GEMM2: out_e [n × H] = act_e [n × I] · w2_eᵀ → (H × n) = (w2_e: I × H)ᵀ · (act_e: I × n).
    row = 0;
    for (int expert = 0; expert < spec.num_experts; ++expert) {
      const int n = load[expert];
      if (n > 0) {
        HMOE_CUBLAS_CHECK(cublasGemmEx(state.handle, CUBLAS_OP_T, CUBLAS_OP_N, spec.hidden, n, spec.intermediate,
                                       &alpha, w2 + expert * hidden * intermediate, CUDA_R_16BF, spec.intermediate,
                                       act.as<const __nv_bfloat16>() + row * intermediate, CUDA_R_16BF,
                                       spec.intermediate, &beta, out.as<__nv_bfloat16>() + row * hidden, CUDA_R_16BF,
                                       spec.hidden, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      row += n;
    }
  };

  std::vector<GraphExec> graphs;
  double launches = 0.0;
  for (std::size_t set = 0; set < tokens_per_expert.size(); ++set) {
    // One eager run first: cuBLAS picks and loads its kernels outside the capture, and any error
    // surfaces here with a plain stack rather than as a failed capture.
    enqueue_layer(tokens_per_expert[set], xs[set]);
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    HMOE_CUDA_CHECK(cudaGetLastError());
    graphs.push_back(GraphExec::capture(stream, [&] { enqueue_layer(tokens_per_expert[set], xs[set]); }));
    const auto hit = std::count_if(tokens_per_expert[set].begin(), tokens_per_expert[set].end(), [](int n) { return n > 0; });
    launches += (2.0 * static_cast<double>(hit) + 1.0) / static_cast<double>(tokens_per_expert.size());
  }

  PeerRow result;
  result.peer = "cublas-loop";
  result.num_tokens = num_tokens;
  result.timing = time_graph_replays(graphs, seconds_per_point, min_replays, stream);
  result.kernel_launches = static_cast<int>(std::lround(launches));
  return result;
}

}  // namespace hmoe::testkit
