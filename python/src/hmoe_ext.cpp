// hmoe._ext: the Python binding of the C++ API (nanobind). Arrays arrive through DLPack from any
// framework (PyTorch, CuPy, JAX, NumPy for the host-side checks), so nothing here links PyTorch.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hmoe/hmoe.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace hmoe::python {
namespace {

using Array = nb::ndarray<>;  // any dtype, shape and device: every property is checked below

// ---- Enums as the short strings the CLI prints ----------------------------------------------------

// field names what was given ("Spec.scheme", "matrix").
template <typename Enum, std::size_t N>
Enum parse_enum(std::string_view text, const char* field, const std::pair<std::string_view, Enum> (&names)[N]) {
  std::string expected;
  for (const auto& [name, value] : names) {
    if (text == name) return value;
    expected += std::string(expected.empty() ? "'" : ", '") + std::string(name) + "'";
  }
  throw Error("hmoe: invalid " + std::string(field) + " = '" + std::string(text) + "': expected one of " + expected);
}

constexpr std::pair<std::string_view, RoutingFunction> kRoutingNames[] = {
    {"softmax", RoutingFunction::kSoftmaxTopK}, {"grouped", RoutingFunction::kGroupedSigmoidTopK}};
constexpr std::pair<std::string_view, LogitsDType> kLogitsNames[] = {{"float32", LogitsDType::kFloat32},
                                                                     {"bfloat16", LogitsDType::kBFloat16}};
constexpr std::pair<std::string_view, WeightDType> kWeightNames[] = {{"bf16", WeightDType::kBF16},
                                                                     {"fp8-e4m3", WeightDType::kFP8E4M3}};
constexpr std::pair<std::string_view, QuantScheme> kSchemeNames[] = {
    {"none", QuantScheme::kNone},
    {"fp8-tensor", QuantScheme::kPerTensor},
    {"fp8-channel", QuantScheme::kPerChannelPerToken},
    {"fp8-block", QuantScheme::kBlock128}};
constexpr std::pair<std::string_view, Orientation> kOrientationNames[] = {
    {"auto", Orientation::kAuto}, {"normal", Orientation::kNormal}, {"swap", Orientation::kSwapAB}};
constexpr std::pair<std::string_view, FusedDecode> kFusedDecodeNames[] = {
    {"auto", FusedDecode::kAuto}, {"on", FusedDecode::kOn}, {"off", FusedDecode::kOff}};
constexpr std::pair<std::string_view, WeightMatrix> kMatrixNames[] = {{"w13", WeightMatrix::kW13},
                                                                      {"w2", WeightMatrix::kW2}};

std::string logits_name(LogitsDType value) { return value == LogitsDType::kFloat32 ? "float32" : "bfloat16"; }

// ---- Array checks: everything the C++ API cannot see behind a raw pointer --------------------------

constexpr int kCuda = static_cast<int>(nb::device::cuda::value);
// DLPack 1.1's kDLFloat8_e4m3fn (torch.float8_e4m3fn); spelled out because older nanobind lacks the name.
constexpr std::uint8_t kFloat8E4m3fnCode = 10;

std::string dtype_name(nb::dlpack::dtype dtype) {
  const char* code = "?";
  switch (static_cast<nb::dlpack::dtype_code>(dtype.code)) {
    case nb::dlpack::dtype_code::Int: code = "int"; break;
    case nb::dlpack::dtype_code::UInt: code = "uint"; break;
    case nb::dlpack::dtype_code::Float: code = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: code = "bfloat"; break;
    default:
      if (dtype.code == kFloat8E4m3fnCode) return "float8_e4m3fn";
      break;
  }
  return code + std::to_string(dtype.bits);
}

std::string shape_text(const Array& array) {
  std::string text = "[";
  for (std::size_t i = 0; i < array.ndim(); ++i) text += (i ? ", " : "") + std::to_string(array.shape(i));
  return text + "]";
}

bool is_dtype(const Array& array, nb::dlpack::dtype_code code, int bits) {
  return array.dtype().code == static_cast<std::uint8_t>(code) && array.dtype().bits == bits &&
         array.dtype().lanes == 1;
}

bool c_contiguous(const Array& array) {
  std::int64_t expected = 1;
  for (std::size_t i = array.ndim(); i-- > 0;) {
    if (array.shape(i) != 1 && array.stride(i) != expected) return false;
    expected *= static_cast<std::int64_t>(array.shape(i));
  }
  return true;
}

// A contiguous array on a CUDA device (the same device as every other array of the call).
void require_device_array(const Array& array, const char* name, int device) {
  if (array.device_type() != kCuda)
    throw Error(std::string("hmoe: ") + name + " is on DLPack device type " + std::to_string(array.device_type()) +
                ": expected a CUDA device array");
  if (array.device_id() != device)
    throw Error(std::string("hmoe: ") + name + " is on cuda:" + std::to_string(array.device_id()) +
                ": expected cuda:" + std::to_string(device) + " like the other arrays of the call");
  if (!c_contiguous(array))
    throw Error(std::string("hmoe: ") + name + " of shape " + shape_text(array) +
                " is not contiguous: expected a row-major contiguous array");
}

void require_dtype(const Array& array, const char* name, nb::dlpack::dtype_code code, int bits) {
  if (!is_dtype(array, code, bits))
    throw Error(std::string("hmoe: ") + name + " has dtype " + dtype_name(array.dtype()) + ": expected " +
                dtype_name(nb::dlpack::dtype{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1}));
}

void require_shape(const Array& array, const char* name, const std::vector<std::int64_t>& shape) {
  bool same = array.ndim() == shape.size();
  std::size_t i = 0;
  std::string expected = "[";
  for (std::int64_t extent : shape) {
    same = same && static_cast<std::int64_t>(array.shape(i)) == extent;
    expected += (i ? ", " : "") + std::to_string(extent);
    ++i;
  }
  if (!same)
    throw Error(std::string("hmoe: ") + name + " has shape " + shape_text(array) + ": expected " + expected + "]");
}

// FP8 weights arrive as e4m3 values or as their raw bytes (a uint8 view, for frameworks without fp8 in DLPack).
void require_e4m3(const Array& array, const char* name) {
  const bool e4m3 = array.dtype().code == kFloat8E4m3fnCode && array.dtype().bits == 8 && array.dtype().lanes == 1;
  if (!e4m3 && !is_dtype(array, nb::dlpack::dtype_code::UInt, 8))
    throw Error(std::string("hmoe: ") + name + " has dtype " + dtype_name(array.dtype()) +
                ": expected float8_e4m3fn (or its bytes as uint8) for an FP8 spec");
}

void require_bytes(const Array& array, const char* name, std::size_t bytes) {
  if (array.nbytes() < bytes)
    throw Error(std::string("hmoe: ") + name + " holds " + std::to_string(array.nbytes()) + " bytes: expected at least " +
                std::to_string(bytes));
}

// The device the launch goes to must hold the arrays; when CUDA cannot answer (no device) the
// launch itself reports it.
void require_current_device(int device) {
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (current != device)
    throw Error("hmoe: the arrays are on cuda:" + std::to_string(device) + " but the current device is cuda:" +
                std::to_string(current) + ": make their device current first");
}

cudaStream_t as_stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

// [E, N, K] of a weight matrix: w13 [E, 2I, H], w2 [E, H, I].
std::vector<std::int64_t> weight_shape(const MoeSpec& spec, WeightMatrix matrix) {
  if (matrix == WeightMatrix::kW13) return {spec.num_experts, 2LL * spec.intermediate, spec.hidden};
  return {spec.num_experts, spec.hidden, spec.intermediate};
}

// The checkpoint layout of a matrix's scales (hmoe.hpp, weight_scale_count): fp8-tensor [E],
// fp8-channel [E, N], fp8-block [E, ceil(N/128), ceil(K/128)]; empty for bf16 specs.
std::vector<std::int64_t> weight_scale_shape(const MoeSpec& spec, WeightMatrix matrix) {
  const std::vector<std::int64_t> shape = weight_shape(spec, matrix);
  switch (spec.scheme) {
    case QuantScheme::kPerTensor: return {shape[0]};
    case QuantScheme::kPerChannelPerToken: return {shape[0], shape[1]};
    case QuantScheme::kBlock128: return {shape[0], (shape[1] + 127) / 128, (shape[2] + 127) / 128};
    case QuantScheme::kNone: break;
  }
  return {};
}

// An optional fp32 scale array of the given shape; nullptr when absent. An empty shape (weight
// scales of a bf16 layer) is not checked here: MoeRunner rejects the pointer with its own message.
const float* scale_pointer(const std::optional<Array>& scale, const char* name, const std::vector<std::int64_t>& shape,
                           int device) {
  if (!scale) return nullptr;
  require_device_array(*scale, name, device);
  require_dtype(*scale, name, nb::dlpack::dtype_code::Float, 32);
  if (!shape.empty()) require_shape(*scale, name, shape);
  return static_cast<const float*>(scale->data());
}

// The FP8 arrays of a run: weight scales in the checkpoint layouts and the static per-tensor
// activation scales ([1] each); all absent for bf16 layers, activation scales absent when dynamic.
struct ScaleArrays {
  std::optional<Array> w13_scale, w2_scale, act_scale, intermediate_act_scale;
};

// x [T, H] bf16 and out of the same shape; returns T.
int check_activations(const MoeSpec& spec, const Array& x, const Array& out, int device) {
  require_device_array(x, "x", device);
  require_dtype(x, "x", nb::dlpack::dtype_code::Bfloat, 16);
  if (x.ndim() != 2 || static_cast<std::int64_t>(x.shape(1)) != spec.hidden)
    throw Error("hmoe: x has shape " + shape_text(x) + ": expected [T, hidden=" + std::to_string(spec.hidden) + "]");
  const auto tokens = static_cast<std::int64_t>(x.shape(0));
  require_device_array(out, "out", device);
  require_dtype(out, "out", nb::dlpack::dtype_code::Bfloat, 16);
  require_shape(out, "out", {tokens, spec.hidden});
  if (tokens > INT32_MAX) throw Error("hmoe: x has " + std::to_string(tokens) + " rows: expected at most 2^31-1");
  return static_cast<int>(tokens);
}

// ---- The runner ----------------------------------------------------------------------------------

// A MoeRunner and the device it was planned on (its kernels were prepared there).
class Runner {
 public:
  Runner(const MoeSpec& spec, int max_tokens, std::string_view orientation, std::size_t max_workspace_bytes,
         std::string_view fused_decode)
      : runner_(spec, options(max_tokens, orientation, max_workspace_bytes, fused_decode)) {
    if (cudaGetDevice(&device_) != cudaSuccess) {
      cudaGetLastError();
      device_ = 0;
    }
  }

  const MoeRunner& runner() const { return runner_; }
  int device() const { return device_; }

  RunArgs run_args(const Array& x, const Array& out, const Array& w13, const Array& w2, const Array& workspace,
                   const std::optional<Array>& invalid_id_count, const ScaleArrays& scales) const {
    const MoeSpec& spec = runner_.spec();
    RunArgs args;
    args.num_tokens = check_activations(spec, x, out, device_);
    require_device_array(w13, "w13", device_);
    require_bytes(w13, "w13", prepared_w13_bytes(spec));
    require_device_array(w2, "w2", device_);
    require_bytes(w2, "w2", prepared_w2_bytes(spec));
    require_device_array(workspace, "workspace", device_);
    if (invalid_id_count) {
      require_device_array(*invalid_id_count, "invalid_id_count", device_);
      require_dtype(*invalid_id_count, "invalid_id_count", nb::dlpack::dtype_code::Int, 32);
      require_shape(*invalid_id_count, "invalid_id_count", {1});
      args.invalid_id_count = static_cast<int*>(invalid_id_count->data());
    }
    args.weights.w13_scale = scale_pointer(scales.w13_scale, "w13_scale", weight_scale_shape(spec, WeightMatrix::kW13),
                                           device_);
    args.weights.w2_scale = scale_pointer(scales.w2_scale, "w2_scale", weight_scale_shape(spec, WeightMatrix::kW2),
                                          device_);
    args.act_scale = scale_pointer(scales.act_scale, "act_scale", {1}, device_);
    args.intermediate_act_scale = scale_pointer(scales.intermediate_act_scale, "intermediate_act_scale", {1}, device_);
    require_current_device(device_);
    args.x = x.data();
    args.out = out.data();
    args.weights.w13 = w13.data();
    args.weights.w2 = w2.data();
    args.workspace = workspace.data();
    args.workspace_size = workspace.nbytes();
    return args;
  }

  void run_from_topk(const Array& x, const Array& out, const Array& w13, const Array& w2, const Array& topk_ids,
                     const Array& topk_weights, const Array& workspace, std::uintptr_t stream,
                     const std::optional<Array>& invalid_id_count, const ScaleArrays& scales) const {
    const RunArgs args = run_args(x, out, w13, w2, workspace, invalid_id_count, scales);
    const std::int64_t tokens = args.num_tokens, top_k = runner_.spec().top_k;
    require_device_array(topk_ids, "topk_ids", device_);
    require_dtype(topk_ids, "topk_ids", nb::dlpack::dtype_code::Int, 32);
    require_shape(topk_ids, "topk_ids", {tokens, top_k});
    require_device_array(topk_weights, "topk_weights", device_);
    require_dtype(topk_weights, "topk_weights", nb::dlpack::dtype_code::Float, 32);
    require_shape(topk_weights, "topk_weights", {tokens, top_k});
    runner_.run_from_topk(args, static_cast<const std::int32_t*>(topk_ids.data()),
                          static_cast<const float*>(topk_weights.data()), as_stream(stream));
  }

  void run_from_logits(const Array& x, const Array& out, const Array& w13, const Array& w2, const Array& router_logits,
                       const Array& workspace, std::uintptr_t stream, const std::optional<Array>& correction_bias,
                       const std::optional<Array>& invalid_id_count, const ScaleArrays& scales) const {
    const MoeSpec& spec = runner_.spec();
    RunArgs args = run_args(x, out, w13, w2, workspace, invalid_id_count, scales);
    require_device_array(router_logits, "router_logits", device_);
    if (spec.routing.logits_dtype == LogitsDType::kFloat32)
      require_dtype(router_logits, "router_logits", nb::dlpack::dtype_code::Float, 32);
    else
      require_dtype(router_logits, "router_logits", nb::dlpack::dtype_code::Bfloat, 16);
    require_shape(router_logits, "router_logits", {args.num_tokens, spec.num_experts});
    if (correction_bias) {
      require_device_array(*correction_bias, "correction_bias", device_);
      require_dtype(*correction_bias, "correction_bias", nb::dlpack::dtype_code::Float, 32);
      require_shape(*correction_bias, "correction_bias", {spec.num_experts});
      args.weights.correction_bias = static_cast<const float*>(correction_bias->data());
    }
    runner_.run_from_logits(args, router_logits.data(), as_stream(stream));
  }

 private:
  static PlanOptions options(int max_tokens, std::string_view orientation, std::size_t max_workspace_bytes,
                             std::string_view fused_decode) {
    PlanOptions options;
    options.max_tokens = max_tokens;
    options.orientation = parse_enum(orientation, "Spec.orientation", kOrientationNames);
    options.max_workspace_bytes = max_workspace_bytes;
    options.fused_decode = parse_enum(fused_decode, "Runner.fused_decode", kFusedDecodeNames);
    return options;
  }

  MoeRunner runner_;
  int device_ = 0;
};

// The weights of a spec: bf16, or e4m3 values for FP8 specs.
void require_weight_dtype(const MoeSpec& spec, const Array& array, const char* name) {
  if (spec.weight_dtype == WeightDType::kFP8E4M3)
    require_e4m3(array, name);
  else
    require_dtype(array, name, nb::dlpack::dtype_code::Bfloat, 16);
}

// Source layouts of DESIGN.md §2 (w13 [E, 2I, H], w2 [E, H, I]; bf16, or e4m3 for FP8 specs) into
// the prepared buffers.
void prepare(const MoeSpec& spec, const Array& w13, const Array& w2, const Array& w13_out, const Array& w2_out,
             std::uintptr_t stream) {
  validate(spec);
  const int device = w13.device_id();
  require_device_array(w13, "w13", device);
  require_weight_dtype(spec, w13, "w13");
  require_shape(w13, "w13", weight_shape(spec, WeightMatrix::kW13));
  require_device_array(w2, "w2", device);
  require_weight_dtype(spec, w2, "w2");
  require_shape(w2, "w2", weight_shape(spec, WeightMatrix::kW2));
  require_device_array(w13_out, "w13_out", device);
  require_bytes(w13_out, "w13_out", prepared_w13_bytes(spec));
  require_device_array(w2_out, "w2_out", device);
  require_bytes(w2_out, "w2_out", prepared_w2_bytes(spec));
  require_current_device(device);
  prepare_weights(spec, w13.data(), w2.data(), w13_out.data(), w2_out.data(), as_stream(stream));
}

// bf16 weights [E, N, K] of one matrix into e4m3 values of the same shape and their scales.
void quantize(const MoeSpec& spec, std::string_view matrix_name, const Array& weights, const Array& values_out,
              const Array& scales_out, std::uintptr_t stream) {
  const WeightMatrix matrix = parse_enum(matrix_name, "matrix", kMatrixNames);
  validate(spec);
  if (spec.weight_dtype != WeightDType::kFP8E4M3)
    throw Error("hmoe: quantize_weights needs an FP8 spec: got weight_dtype = " + to_string(spec.weight_dtype));
  const int device = weights.device_id();
  const std::vector<std::int64_t> shape = weight_shape(spec, matrix);
  require_device_array(weights, "weights", device);
  require_dtype(weights, "weights", nb::dlpack::dtype_code::Bfloat, 16);
  require_shape(weights, "weights", shape);
  require_device_array(values_out, "values_out", device);
  require_e4m3(values_out, "values_out");
  require_shape(values_out, "values_out", shape);
  require_device_array(scales_out, "scales_out", device);
  require_dtype(scales_out, "scales_out", nb::dlpack::dtype_code::Float, 32);
  require_shape(scales_out, "scales_out", weight_scale_shape(spec, matrix));
  require_current_device(device);
  quantize_weights(spec, matrix, weights.data(), values_out.data(), static_cast<float*>(scales_out.data()),
                   as_stream(stream));
}

nb::dict plan_dict(const PlanInfo& info) {
  nb::dict plan;
  plan["orientation"] = to_string(info.orientation);
  plan["token_tile"] = info.token_tile;
  plan["weight_tile"] = info.weight_tile;
  plan["gemm1_kernel"] = info.gemm1_kernel;
  plan["gemm2_kernel"] = info.gemm2_kernel;
  plan["num_chunks"] = info.num_chunks;
  plan["gemm1_splits"] = info.gemm1_splits;
  plan["gemm2_splits"] = info.gemm2_splits;
  plan["source"] = info.source;
  plan["fused_decode"] = info.fused_decode;
  plan["fused_requant"] = info.fused_requant;
  return plan;
}

std::string spec_repr(const MoeSpec& spec) {
  std::string text = "Spec(num_experts=" + std::to_string(spec.num_experts) + ", top_k=" + std::to_string(spec.top_k) +
                     ", hidden=" + std::to_string(spec.hidden) + ", intermediate=" + std::to_string(spec.intermediate) +
                     ", routing='" + to_string(spec.routing.function) + "'";
  if (spec.routing.function == RoutingFunction::kSoftmaxTopK) {
    text += std::string(", renormalize=") + (spec.routing.renormalize ? "True" : "False");
  } else {
    text += ", num_groups=" + std::to_string(spec.routing.num_groups) +
            ", topk_groups=" + std::to_string(spec.routing.topk_groups) +
            ", routed_scaling_factor=" + std::to_string(spec.routing.routed_scaling_factor);
  }
  text += ", logits_dtype='" + logits_name(spec.routing.logits_dtype) + "', weight_dtype='" +
          to_string(spec.weight_dtype) + "', scheme='" + to_string(spec.scheme) + "'";
  if (spec.batch_invariant) text += ", batch_invariant=True";
  if (spec.ue8m0_scales) text += ", ue8m0_scales=True";
  return text + ")";
}

}  // namespace
}  // namespace hmoe::python

NB_MODULE(_ext, m) {
  using namespace hmoe;
  using namespace hmoe::python;
  m.doc() = "hmoe's C++ API over DLPack arrays (see hmoe.torch for the PyTorch op)";

  // hmoe::Error becomes InvalidArgumentError (a ValueError) or, for a failed CUDA call, CudaError
  // (a RuntimeError); both derive from hmoe.Error and carry the C++ message unchanged.
  // NOTE: deliberately leaked references: the translator may run until interpreter shutdown.
  static PyObject* const base_error = PyErr_NewException("hmoe.Error", PyExc_Exception, nullptr);
  static PyObject* const invalid_argument = PyErr_NewException(
      "hmoe.InvalidArgumentError", nb::make_tuple(nb::handle(base_error), nb::handle(PyExc_ValueError)).ptr(), nullptr);
  static PyObject* const cuda_error = PyErr_NewException(
      "hmoe.CudaError", nb::make_tuple(nb::handle(base_error), nb::handle(PyExc_RuntimeError)).ptr(), nullptr);
  m.attr("Error") = nb::borrow(base_error);
  m.attr("InvalidArgumentError") = nb::borrow(invalid_argument);
  m.attr("CudaError") = nb::borrow(cuda_error);
  nb::register_exception_translator([](const std::exception_ptr& pointer, void*) {
    try {
      std::rethrow_exception(pointer);
    } catch (const Error& error) {
      const bool cuda = std::string_view(error.what()).rfind("hmoe: CUDA error", 0) == 0;
      PyErr_SetString(cuda ? cuda_error : invalid_argument, error.what());
    }
  });

  nb::class_<MoeSpec>(m, "Spec", "One MoE layer: E, k, H, I, routing and weight type (hmoe::MoeSpec). "
                                 "Construction checks nothing; validate(), Runner and prepare_weights do.")
      .def(
          "__init__",
          [](MoeSpec* self, int num_experts, int top_k, int hidden, int intermediate, std::string_view routing,
             bool renormalize, int num_groups, int topk_groups, float routed_scaling_factor,
             std::string_view logits_dtype, std::string_view weight_dtype, std::string_view scheme,
             bool batch_invariant, bool ue8m0_scales) {
            MoeSpec spec;
            spec.num_experts = num_experts;
            spec.top_k = top_k;
            spec.hidden = hidden;
            spec.intermediate = intermediate;
            spec.routing.function = parse_enum(routing, "Spec.routing", kRoutingNames);
            spec.routing.renormalize = renormalize;
            spec.routing.num_groups = num_groups;
            spec.routing.topk_groups = topk_groups;
            spec.routing.routed_scaling_factor = routed_scaling_factor;
            spec.routing.logits_dtype = parse_enum(logits_dtype, "Spec.logits_dtype", kLogitsNames);
            spec.weight_dtype = parse_enum(weight_dtype, "Spec.weight_dtype", kWeightNames);
            spec.scheme = parse_enum(scheme, "Spec.scheme", kSchemeNames);
            spec.batch_invariant = batch_invariant;
            spec.ue8m0_scales = ue8m0_scales;
            new (self) MoeSpec(spec);
          },
          "num_experts"_a, "top_k"_a, "hidden"_a, "intermediate"_a, nb::kw_only(), "routing"_a = "softmax",
          "renormalize"_a = true, "num_groups"_a = 1, "topk_groups"_a = 1, "routed_scaling_factor"_a = 1.0f,
          "logits_dtype"_a = "float32", "weight_dtype"_a = "bf16", "scheme"_a = "none", "batch_invariant"_a = false,
          "ue8m0_scales"_a = false)
      .def_rw("num_experts", &MoeSpec::num_experts)
      .def_rw("top_k", &MoeSpec::top_k)
      .def_rw("hidden", &MoeSpec::hidden)
      .def_rw("intermediate", &MoeSpec::intermediate)
      .def_rw("batch_invariant", &MoeSpec::batch_invariant)
      .def_rw("ue8m0_scales", &MoeSpec::ue8m0_scales)
      .def_prop_rw(
          "routing", [](const MoeSpec& spec) { return to_string(spec.routing.function); },
          [](MoeSpec& spec, std::string_view value) {
            spec.routing.function = parse_enum(value, "Spec.routing", kRoutingNames);
          })
      .def_prop_rw(
          "renormalize", [](const MoeSpec& spec) { return spec.routing.renormalize; },
          [](MoeSpec& spec, bool value) { spec.routing.renormalize = value; })
      .def_prop_rw(
          "num_groups", [](const MoeSpec& spec) { return spec.routing.num_groups; },
          [](MoeSpec& spec, int value) { spec.routing.num_groups = value; })
      .def_prop_rw(
          "topk_groups", [](const MoeSpec& spec) { return spec.routing.topk_groups; },
          [](MoeSpec& spec, int value) { spec.routing.topk_groups = value; })
      .def_prop_rw(
          "routed_scaling_factor", [](const MoeSpec& spec) { return spec.routing.routed_scaling_factor; },
          [](MoeSpec& spec, float value) { spec.routing.routed_scaling_factor = value; })
      .def_prop_rw(
          "logits_dtype", [](const MoeSpec& spec) { return logits_name(spec.routing.logits_dtype); },
          [](MoeSpec& spec, std::string_view value) {
            spec.routing.logits_dtype = parse_enum(value, "Spec.logits_dtype", kLogitsNames);
          })
      .def_prop_rw(
          "weight_dtype", [](const MoeSpec& spec) { return to_string(spec.weight_dtype); },
          [](MoeSpec& spec, std::string_view value) {
            spec.weight_dtype = parse_enum(value, "Spec.weight_dtype", kWeightNames);
          })
      .def_prop_rw(
          "scheme", [](const MoeSpec& spec) { return to_string(spec.scheme); },
          [](MoeSpec& spec, std::string_view value) { spec.scheme = parse_enum(value, "Spec.scheme", kSchemeNames); })
      .def("validate", [](const MoeSpec& spec) { validate(spec); }, "Raises InvalidArgumentError naming the first bad field.")
      .def("__repr__", &spec_repr);

  m.def("preset", [](std::string_view name) { return preset(name); }, "name"_a,
        "The Spec of a model preset of DESIGN.md §3 (preset_names() lists them).");
  m.def("preset_names", &preset_names);
  m.def("version", &version);
  m.def("compiled_kernels", &compiled_kernels, "Every expert-GEMM variant compiled into the library.");
  m.def(
      "prepared_weight_bytes",
      [](const MoeSpec& spec) { return std::make_pair(prepared_w13_bytes(spec), prepared_w2_bytes(spec)); },
      "spec"_a, "Bytes of the prepared (w13, w2) buffers prepare_weights writes.");
  m.def("prepare_weights", &prepare, "spec"_a, "w13"_a, "w2"_a, "w13_out"_a, "w2_out"_a, "stream"_a,
        "Re-lays out w13 [E, 2I, H] and w2 [E, H, I] (bf16, CUDA) into the prepared buffers, "
        "asynchronously on stream (a cudaStream_t as an integer; 0 is the legacy default stream). "
        "FP8 specs take e4m3 values (float8_e4m3fn, or their bytes as uint8); their scales are not prepared.");
  m.def(
      "weight_scale_count",
      [](const MoeSpec& spec, std::string_view matrix) {
        return weight_scale_count(spec, parse_enum(matrix, "matrix", kMatrixNames));
      },
      "spec"_a, "matrix"_a, "fp32 scales of matrix 'w13' or 'w2' (0 for bf16 specs).");
  m.def(
      "weight_scale_shape",
      [](const MoeSpec& spec, std::string_view matrix) {
        validate(spec);
        return weight_scale_shape(spec, parse_enum(matrix, "matrix", kMatrixNames));
      },
      "spec"_a, "matrix"_a,
      "The checkpoint layout of a matrix's scales, N and K its rows and columns (w13 [E, 2I, H], w2 [E, H, I]): "
      "fp8-tensor [E], fp8-channel [E, N], fp8-block [E, ceil(N/128), ceil(K/128)]; [] for bf16.");
  m.def("quantize_weights", &quantize, "spec"_a, "matrix"_a, "weights"_a, "values_out"_a, "scales_out"_a, "stream"_a,
        "Quantises bf16 weights of matrix 'w13' [E, 2I, H] or 'w2' [E, H, I] (CUDA) with the spec's FP8 scheme "
        "into e4m3 values of the same shape and fp32 scales (weight_scale_shape), asynchronously on stream.");

  nb::class_<Runner>(m, "Runner", "A planned layer (hmoe::MoeRunner) for up to max_tokens tokens per run, "
                                  "bound to the CUDA device current when it was made.")
      .def(nb::init<const MoeSpec&, int, std::string_view, std::size_t, std::string_view>(), "spec"_a, "max_tokens"_a,
           nb::kw_only(), "orientation"_a = "auto", "max_workspace_bytes"_a = 0, "fused_decode"_a = "auto",
           "fused_decode: 'auto' (the fused decode layer at T <= 4 where this device's tuned table says so), "
           "'on' (wherever it applies) or 'off' (PlanOptions::fused_decode).")
      .def_prop_ro("spec", [](const Runner& self) { return self.runner().spec(); })
      .def_prop_ro("device", &Runner::device)
      .def_prop_ro("workspace_bytes", [](const Runner& self) { return self.runner().workspace_bytes(); })
      .def_prop_ro("chunk_tokens", [](const Runner& self) { return self.runner().chunk_tokens(); })
      .def(
          "plan_info", [](const Runner& self, int num_tokens) { return plan_dict(self.runner().plan_info(num_tokens)); },
          "num_tokens"_a)
      .def(
          "run_from_topk",
          [](const Runner& self, const Array& x, const Array& out, const Array& w13, const Array& w2,
             const Array& topk_ids, const Array& topk_weights, const Array& workspace, std::uintptr_t stream,
             const std::optional<Array>& invalid_id_count, const std::optional<Array>& w13_scale,
             const std::optional<Array>& w2_scale, const std::optional<Array>& act_scale,
             const std::optional<Array>& intermediate_act_scale) {
            self.run_from_topk(x, out, w13, w2, topk_ids, topk_weights, workspace, stream, invalid_id_count,
                               {w13_scale, w2_scale, act_scale, intermediate_act_scale});
          },
          "x"_a, "out"_a, "w13"_a, "w2"_a, "topk_ids"_a, "topk_weights"_a, "workspace"_a, "stream"_a,
          "invalid_id_count"_a = nb::none(), nb::kw_only(), "w13_scale"_a = nb::none(), "w2_scale"_a = nb::none(),
          "act_scale"_a = nb::none(), "intermediate_act_scale"_a = nb::none(),
          "out[t] = Σ_j topk_weights[t,j]·expert_{topk_ids[t,j]}(x[t]); asynchronous on stream, no allocation. "
          "FP8 specs: w13_scale / w2_scale (fp32, weight_scale_shape) and, fp8-tensor only, the static "
          "act_scale / intermediate_act_scale ([1] fp32; None: dynamic).")
      .def(
          "run_from_logits",
          [](const Runner& self, const Array& x, const Array& out, const Array& w13, const Array& w2,
             const Array& router_logits, const Array& workspace, std::uintptr_t stream,
             const std::optional<Array>& correction_bias, const std::optional<Array>& invalid_id_count,
             const std::optional<Array>& w13_scale, const std::optional<Array>& w2_scale,
             const std::optional<Array>& act_scale, const std::optional<Array>& intermediate_act_scale) {
            self.run_from_logits(x, out, w13, w2, router_logits, workspace, stream, correction_bias, invalid_id_count,
                                 {w13_scale, w2_scale, act_scale, intermediate_act_scale});
          },
          "x"_a, "out"_a, "w13"_a, "w2"_a, "router_logits"_a, "workspace"_a, "stream"_a,
          "correction_bias"_a = nb::none(), "invalid_id_count"_a = nb::none(), nb::kw_only(),
          "w13_scale"_a = nb::none(), "w2_scale"_a = nb::none(), "act_scale"_a = nb::none(),
          "intermediate_act_scale"_a = nb::none(),
          "Routes with the spec's routing function, then runs the experts; asynchronous on stream. "
          "FP8 arguments as in run_from_topk.");
}
