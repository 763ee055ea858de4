"""The extension on any machine (no GPU, no PyTorch needed): it imports, and every validation error
of the C++ API and of the binding surfaces as a Python exception carrying the C++ message. Arrays are
fake DLPack arrays (fake_dlpack.py) or NumPy; every call here fails before anything is launched."""

import importlib
import os

import pytest

import hmoe
from fake_dlpack import KDL_CPU, FakeArray, FakeHeap

QWEN = dict(num_experts=128, top_k=8, hidden=2048, intermediate=768)


def raises_cpp(message, call, *args, **kwargs):
    """call(...) raises hmoe.InvalidArgumentError whose text is exactly `message` (the C++ text)."""
    with pytest.raises(hmoe.InvalidArgumentError) as caught:
        call(*args, **kwargs)
    assert str(caught.value) == message
    return caught.value


def test_import_and_metadata():
    assert hmoe.__version__ == hmoe.version() == "0.1.0"
    assert set(hmoe.preset_names()) == {"mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b-tp4", "deepseek-v3-tp8",
                                        "olmoe-1b-7b"}
    kernels = hmoe.compiled_kernels()
    assert any("swap" in name for name in kernels) and any("normal" in name for name in kernels)


def test_exception_hierarchy():
    assert issubclass(hmoe.InvalidArgumentError, hmoe.Error)
    assert issubclass(hmoe.InvalidArgumentError, ValueError)
    assert issubclass(hmoe.CudaError, hmoe.Error)
    assert issubclass(hmoe.CudaError, RuntimeError)


def test_presets_round_trip():
    spec = hmoe.preset("deepseek-v3-tp8")
    assert (spec.num_experts, spec.top_k, spec.hidden, spec.intermediate) == (256, 8, 7168, 256)
    assert (spec.routing, spec.num_groups, spec.topk_groups) == ("grouped", 8, 4)
    assert spec.routed_scaling_factor == pytest.approx(2.5)
    spec.validate()
    assert "num_experts=256" in repr(spec)
    raises_cpp("hmoe: unknown preset 'nope': expected one of mixtral-8x7b, qwen3-30b-a3b, qwen3-235b-a22b-tp4, "
               "deepseek-v3-tp8, olmoe-1b-7b", hmoe.preset, "nope")


@pytest.mark.parametrize("changes, message", [
    (dict(num_experts=0), "hmoe: invalid MoeSpec.num_experts = 0: expected 1..1024"),
    (dict(num_experts=2000), "hmoe: invalid MoeSpec.num_experts = 2000: expected 1..1024"),
    (dict(top_k=0), "hmoe: invalid MoeSpec.top_k = 0: expected 1..min(num_experts=128, 32)"),
    (dict(top_k=33), "hmoe: invalid MoeSpec.top_k = 33: expected 1..min(num_experts=128, 32)"),
    (dict(hidden=100), "hmoe: invalid MoeSpec.hidden = 100: expected a multiple of 64 in 64..65536"),
    (dict(intermediate=70000), "hmoe: invalid MoeSpec.intermediate = 70000: expected a multiple of 64 in 64..65536"),
    (dict(scheme="fp8-block"), "hmoe: invalid MoeSpec.scheme = 3: expected QuantScheme::kNone for bf16 weights"),
    (dict(weight_dtype="fp8-e4m3"), "hmoe: invalid MoeSpec.scheme = 0: expected an FP8 scheme for fp8 weights"),
    (dict(ue8m0_scales=True), "hmoe: invalid MoeSpec.ue8m0_scales = 1: expected false for bf16 weights (UE8M0 rounds "
                              "FP8 scales)"),
    (dict(weight_dtype="fp8-e4m3", scheme="fp8-block", hidden=2112),
     "hmoe: invalid MoeSpec.hidden = 2112: expected a multiple of 128 for fp8-block scales (128x128 weight blocks "
     "along K)"),
    (dict(weight_dtype="fp8-e4m3", scheme="fp8-block", intermediate=832),
     "hmoe: invalid MoeSpec.intermediate = 832: expected a multiple of 128 for fp8-block scales (128x128 weight "
     "blocks along K)"),
    (dict(routing="grouped", num_groups=3),
     "hmoe: invalid MoeSpec.routing.num_groups = 3: expected a divisor of num_experts=128 in 1..32"),
    (dict(routing="grouped", num_groups=8, topk_groups=9),
     "hmoe: invalid MoeSpec.routing.topk_groups = 9: expected 1..num_groups=8"),
    (dict(routing="grouped", num_groups=8, topk_groups=4, routed_scaling_factor=0.0),
     "hmoe: invalid MoeSpec.routing.routed_scaling_factor = 0: expected a finite value > 0"),
])
def test_spec_validation_messages(changes, message):
    spec = hmoe.Spec(**{**QWEN, **changes})
    raises_cpp(message, spec.validate)
    # Every entry point validates the spec the same way, before touching a device.
    raises_cpp(message, hmoe.Runner, spec, 16)
    raises_cpp(message, hmoe.prepared_weight_bytes, spec)


@pytest.mark.parametrize("field, value, names", [
    ("routing", "sigmoid", "'softmax', 'grouped'"),
    ("logits_dtype", "float16", "'float32', 'bfloat16'"),
    ("weight_dtype", "int4", "'bf16', 'fp8-e4m3'"),
    ("scheme", "fp4", "'none', 'fp8-tensor', 'fp8-channel', 'fp8-block'"),
])
def test_unknown_enum_names(field, value, names):
    raises_cpp(f"hmoe: invalid Spec.{field} = '{value}': expected one of {names}", hmoe.Spec, **QWEN, **{field: value})
    spec = hmoe.Spec(**QWEN)
    raises_cpp(f"hmoe: invalid Spec.{field} = '{value}': expected one of {names}", setattr, spec, field, value)


def test_runner_plan_options():
    spec = hmoe.Spec(**QWEN)
    raises_cpp("hmoe: invalid PlanOptions.max_tokens = 0: expected 1..1048576", hmoe.Runner, spec, 0)
    raises_cpp("hmoe: invalid PlanOptions.max_tokens = 2000000: expected 1..1048576", hmoe.Runner, spec, 2000000)
    raises_cpp("hmoe: invalid Spec.orientation = 'sideways': expected one of 'auto', 'normal', 'swap'", hmoe.Runner,
               spec, 16, orientation="sideways")
    invariant = hmoe.Spec(**QWEN, batch_invariant=True)
    raises_cpp("hmoe: invalid PlanOptions.orientation = swap with MoeSpec.batch_invariant: expected auto or normal "
               "(batch-invariant mode always runs the normal orientation)", hmoe.Runner, invariant, 16,
               orientation="swap")
    with pytest.raises(hmoe.InvalidArgumentError, match=r"^hmoe: .*max_workspace_bytes"):
        hmoe.Runner(spec, 16, max_workspace_bytes=1)
    raises_cpp("hmoe: invalid Runner.fused_decode = 'yes': expected one of 'auto', 'on', 'off'", hmoe.Runner, spec,
               16, fused_decode="yes")


def test_runner_plans_on_the_host():
    runner = hmoe.Runner(hmoe.Spec(**QWEN), 64)
    assert runner.workspace_bytes > 64 * 8 * (2048 + 768) * 2
    assert runner.chunk_tokens == 64
    plan = runner.plan_info(1)
    assert plan["orientation"] in ("normal", "swap") and plan["gemm1_kernel"] in hmoe.compiled_kernels()
    assert plan["gemm1_splits"] >= 1 and plan["gemm2_splits"] >= 1   # splits along K (1: none)
    assert runner.spec.top_k == 8


@pytest.mark.skipif("HMOE_FUSED_DECODE" in os.environ, reason="HMOE_FUSED_DECODE overrides fused_decode")
def test_runner_fused_decode_option():
    spec = hmoe.Spec(**QWEN)
    on = hmoe.Runner(spec, 64, fused_decode="on")
    for tokens in (1, 4):
        plan = on.plan_info(tokens)
        assert plan["fused_decode"] and plan["gemm1_kernel"] == "decode_layer" and plan["gemm2_kernel"] == ""
        assert plan["source"] == "option"
    assert not on.plan_info(5)["fused_decode"]   # the fused layer runs T <= 4 only
    off = hmoe.Runner(spec, 64, fused_decode="off")
    assert not any(off.plan_info(tokens)["fused_decode"] for tokens in (1, 2, 3, 4))
    # 'auto' (the default) follows the tuned table; a forced orientation never fuses.
    assert not hmoe.Runner(spec, 64, orientation="swap", fused_decode="on").plan_info(1)["fused_decode"]


def test_prepared_weight_bytes():
    w13_bytes, w2_bytes = hmoe.prepared_weight_bytes(hmoe.Spec(**QWEN))
    assert w13_bytes == 128 * 2 * 768 * 2048 * 2
    assert w2_bytes == 128 * 2048 * 768 * 2
    # FP8: one byte per weight, whatever the scheme (the scales are not prepared).
    for scheme in ("fp8-tensor", "fp8-channel", "fp8-block"):
        spec = hmoe.Spec(**QWEN, weight_dtype="fp8-e4m3", scheme=scheme)
        assert hmoe.prepared_weight_bytes(spec) == (128 * 2 * 768 * 2048, 128 * 2048 * 768)


# ---- FP8: specs, scale layouts, quantisation and preparation arguments ------------------------------

@pytest.mark.parametrize("scheme, w13_shape, w2_shape", [
    ("fp8-tensor", [128], [128]),
    ("fp8-channel", [128, 1536], [128, 2048]),
    ("fp8-block", [128, 12, 16], [128, 16, 6]),
])
def test_weight_scale_layouts(scheme, w13_shape, w2_shape):
    spec = hmoe.Spec(**QWEN, weight_dtype="fp8-e4m3", scheme=scheme)
    spec.validate()
    for matrix, shape in (("w13", w13_shape), ("w2", w2_shape)):
        assert hmoe.weight_scale_shape(spec, matrix) == shape
        count = 1
        for extent in shape:
            count *= extent
        assert hmoe.weight_scale_count(spec, matrix) == count  # the binding's layout agrees with the C++ count
    print(f"{scheme}: w13 scales {w13_shape}, w2 scales {w2_shape}")


def test_weight_scale_count_edge_cases():
    assert hmoe.weight_scale_count(hmoe.Spec(**QWEN), "w13") == 0
    assert hmoe.weight_scale_shape(hmoe.Spec(**QWEN), "w2") == []
    spec = hmoe.Spec(**QWEN, weight_dtype="fp8-e4m3", scheme="fp8-block")
    raises_cpp("hmoe: invalid matrix = 'w3': expected one of 'w13', 'w2'", hmoe.weight_scale_count, spec, "w3")
    raises_cpp("hmoe: invalid matrix = 'w1': expected one of 'w13', 'w2'", hmoe.weight_scale_shape, spec, "w1")


def test_ue8m0_spec_field():
    spec = hmoe.Spec(**QWEN, weight_dtype="fp8-e4m3", scheme="fp8-block", ue8m0_scales=True)
    spec.validate()
    assert spec.ue8m0_scales and "ue8m0_scales=True" in repr(spec)
    spec.ue8m0_scales = False
    assert "ue8m0" not in repr(spec)
    assert "scheme='fp8-block'" in repr(spec) and "weight_dtype='fp8-e4m3'" in repr(spec)


def test_fp8_prepare_weights_checks():
    spec = hmoe.Spec(8, 2, 256, 128, weight_dtype="fp8-e4m3", scheme="fp8-block")
    heap = FakeHeap()
    w13_out, w2_out = heap.array((8 * 256 * 256,), "uint8"), heap.array((8 * 256 * 128,), "uint8")
    raises_cpp("hmoe: w13 has dtype bfloat16: expected float8_e4m3fn (or its bytes as uint8) for an FP8 spec",
               hmoe.prepare_weights, spec, heap.array((8, 256, 256)), heap.array((8, 256, 128), "uint8"), w13_out,
               w2_out, 0)
    raises_cpp("hmoe: w2 has dtype int32: expected float8_e4m3fn (or its bytes as uint8) for an FP8 spec",
               hmoe.prepare_weights, spec, heap.array((8, 256, 256), "float8_e4m3fn"),
               heap.array((8, 256, 128), "int32"), w13_out, w2_out, 0)
    # e4m3 values and their uint8 bytes pass the dtype checks; the output sizes are 1 byte per weight.
    for dtype in ("float8_e4m3fn", "uint8"):
        raises_cpp("hmoe: w13_out holds 1000 bytes: expected at least 524288", hmoe.prepare_weights, spec,
                   heap.array((8, 256, 256), dtype), heap.array((8, 256, 128), dtype),
                   heap.array((1000,), "uint8"), w2_out, 0)
    raises_cpp("hmoe: w2 has shape [8, 128, 256]: expected [8, 256, 128]", hmoe.prepare_weights, spec,
               heap.array((8, 256, 256), "uint8"), heap.array((8, 128, 256), "uint8"), w13_out, w2_out, 0)


def test_quantize_weights_checks():
    spec = hmoe.Spec(8, 2, 256, 128, weight_dtype="fp8-e4m3", scheme="fp8-block")
    heap = FakeHeap()
    w2, values = heap.array((8, 256, 128)), heap.array((8, 256, 128), "float8_e4m3fn")
    scales = heap.array((8, 2, 1), "float32")
    raises_cpp("hmoe: quantize_weights needs an FP8 spec: got weight_dtype = bf16", hmoe.quantize_weights,
               hmoe.Spec(8, 2, 256, 128), "w2", w2, values, scales, 0)
    raises_cpp("hmoe: invalid matrix = 'w1': expected one of 'w13', 'w2'", hmoe.quantize_weights, spec, "w1", w2,
               values, scales, 0)
    raises_cpp("hmoe: weights has shape [8, 256, 128]: expected [8, 256, 256]", hmoe.quantize_weights, spec, "w13",
               w2, values, scales, 0)
    raises_cpp("hmoe: weights has dtype float32: expected bfloat16", hmoe.quantize_weights, spec, "w2",
               heap.array((8, 256, 128), "float32"), values, scales, 0)
    raises_cpp("hmoe: values_out has dtype bfloat16: expected float8_e4m3fn (or its bytes as uint8) for an FP8 spec",
               hmoe.quantize_weights, spec, "w2", w2, heap.array((8, 256, 128)), scales, 0)
    raises_cpp("hmoe: scales_out has shape [8, 2, 2]: expected [8, 2, 1]", hmoe.quantize_weights, spec, "w2", w2,
               values, heap.array((8, 2, 2), "float32"), 0)
    raises_cpp("hmoe: scales_out has shape [8]: expected [8, 256]", hmoe.quantize_weights,
               hmoe.Spec(8, 2, 256, 128, weight_dtype="fp8-e4m3", scheme="fp8-channel"), "w2", w2, values,
               heap.array((8,), "float32"), 0)
    raises_cpp("hmoe: scales_out is on DLPack device type 1: expected a CUDA device array", hmoe.quantize_weights,
               spec, "w2", w2, values, FakeArray((8, 2, 1), "float32", device_type=KDL_CPU), 0)


# ---- Run arguments: checked by the binding (what a raw pointer cannot show), then by MoeRunner ----

class Layer:
    """A runner for E=8, k=2, H=256, I=128 and fake device arrays for one run of T tokens."""

    def __init__(self, tokens=4, max_tokens=16):
        self.spec = hmoe.Spec(8, 2, 256, 128)
        self.runner = hmoe.Runner(self.spec, max_tokens)
        heap = FakeHeap()
        w13_bytes, w2_bytes = hmoe.prepared_weight_bytes(self.spec)
        self.args = dict(
            x=heap.array((tokens, 256)),
            out=heap.array((tokens, 256)),
            w13=heap.array((w13_bytes,), "uint8"),
            w2=heap.array((w2_bytes,), "uint8"),
            topk_ids=heap.array((tokens, 2), "int32"),
            topk_weights=heap.array((tokens, 2), "float32"),
            workspace=heap.array((self.runner.workspace_bytes,), "uint8"),
            stream=0,
        )
        self.heap = heap

    def run_topk(self, **changes):
        self.runner.run_from_topk(**{**self.args, **changes})

    def run_logits(self, logits, **changes):
        args = {**self.args, **changes}
        del args["topk_ids"], args["topk_weights"]
        self.runner.run_from_logits(router_logits=logits, **args)


@pytest.mark.parametrize("change, message", [
    (lambda a: dict(x=FakeArray((4, 256), device_type=KDL_CPU)),
     "hmoe: x is on DLPack device type 1: expected a CUDA device array"),
    (lambda a: dict(x=FakeArray((4, 256), device_id=1)),
     "hmoe: x is on cuda:1: expected cuda:0 like the other arrays of the call"),
    (lambda a: dict(x=FakeArray((4, 256), "float32")), "hmoe: x has dtype float32: expected bfloat16"),
    (lambda a: dict(x=FakeArray((4, 512))), "hmoe: x has shape [4, 512]: expected [T, hidden=256]"),
    (lambda a: dict(x=FakeArray((4, 256), strides=(1, 4))),
     "hmoe: x of shape [4, 256] is not contiguous: expected a row-major contiguous array"),
    (lambda a: dict(out=FakeArray((5, 256))), "hmoe: out has shape [5, 256]: expected [4, 256]"),
    (lambda a: dict(w13=FakeArray((1000,), "uint8")), "hmoe: w13 holds 1000 bytes: expected at least 1048576"),
    (lambda a: dict(w2=FakeArray((10,), "uint8")), "hmoe: w2 holds 10 bytes: expected at least 524288"),
    (lambda a: dict(topk_ids=FakeArray((4, 2), "float32")), "hmoe: topk_ids has dtype float32: expected int32"),
    (lambda a: dict(topk_ids=FakeArray((4, 3), "int32")), "hmoe: topk_ids has shape [4, 3]: expected [4, 2]"),
    (lambda a: dict(topk_weights=FakeArray((4, 2), "bfloat16")),
     "hmoe: topk_weights has dtype bfloat16: expected float32"),
    (lambda a: dict(workspace=FakeArray((100,), "uint8", device_type=KDL_CPU)),
     "hmoe: workspace is on DLPack device type 1: expected a CUDA device array"),
])
def test_binding_checks_arrays(change, message):
    layer = Layer()
    raises_cpp(message, layer.run_topk, **change(layer.args))


def test_runner_checks_run_args():
    layer = Layer()
    heap = layer.heap
    raises_cpp("hmoe: RunArgs.num_tokens = 17: expected 0..max_tokens=16", layer.run_topk,
               x=heap.array((17, 256)), out=heap.array((17, 256)), topk_ids=heap.array((17, 2), "int32"),
               topk_weights=heap.array((17, 2), "float32"))
    raises_cpp(f"hmoe: RunArgs.x = {hex(0x7F0000000002)} is not 16-byte aligned", layer.run_topk,
               x=FakeArray((4, 256), address=0x7F0000000002))
    raises_cpp("hmoe: RunArgs.out is null: expected a device pointer", layer.run_topk,
               out=FakeArray((4, 256), address=0))
    workspace_bytes = layer.runner.workspace_bytes
    small = heap.array((workspace_bytes - 256,), "uint8")
    raises_cpp(f"hmoe: RunArgs.workspace_size = {workspace_bytes - 256}: expected at least {workspace_bytes} "
               "(MoeRunner::workspace_bytes())", layer.run_topk, workspace=small)
    raises_cpp(f"hmoe: RunArgs.workspace = {hex(0x7F0000000080)} is not 256-byte aligned", layer.run_topk,
               workspace=FakeArray((workspace_bytes,), "uint8", address=0x7F0000000080))
    shared = layer.args["workspace"]
    with pytest.raises(hmoe.InvalidArgumentError, match=r"^hmoe: RunArgs.workspace = 0x[0-9a-f]+ \(\d+ bytes\) "
                                                         r"overlaps RunArgs.out"):
        layer.run_topk(out=FakeArray((4, 256), address=shared.address))
    raises_cpp("hmoe: topk_ids = " + hex(0x7F0000000002) + " is not 4-byte aligned", layer.run_topk,
               topk_ids=FakeArray((4, 2), "int32", address=0x7F0000000002))


def test_runner_checks_logits_and_bias():
    layer = Layer()
    heap = layer.heap
    raises_cpp("hmoe: router_logits has dtype bfloat16: expected float32", layer.run_logits,
               heap.array((4, 8), "bfloat16"))
    raises_cpp("hmoe: router_logits has shape [4, 9]: expected [4, 8]", layer.run_logits, heap.array((4, 9), "float32"))
    raises_cpp("hmoe: correction_bias has shape [7]: expected [8]", layer.run_logits, heap.array((4, 8), "float32"),
               correction_bias=heap.array((7,), "float32"))
    raises_cpp("hmoe: invalid_id_count has dtype float32: expected int32", layer.run_logits,
               heap.array((4, 8), "float32"), invalid_id_count=heap.array((1,), "float32"))
    with pytest.raises(hmoe.InvalidArgumentError, match=r"^hmoe: RunArgs.out = 0x[0-9a-f]+ \(2048 bytes\) overlaps "
                                                         r"router_logits"):
        logits = heap.array((4, 8), "float32")
        layer.run_logits(logits, out=FakeArray((4, 256), address=logits.address))


def test_numpy_arrays_are_rejected_as_host_memory():
    np = pytest.importorskip("numpy")
    layer = Layer()
    x = np.zeros((4, 256), dtype=np.float32)
    raises_cpp("hmoe: x is on DLPack device type 1: expected a CUDA device array", layer.run_topk, x=x)
    with pytest.raises(TypeError):
        layer.run_topk(x="not an array")


def test_prepare_weights_checks():
    spec = hmoe.Spec(8, 2, 256, 128)
    heap = FakeHeap()
    w13, w2 = heap.array((8, 256, 256)), heap.array((8, 256, 128))
    w13_out, w2_out = heap.array((8 * 256 * 256 * 2,), "uint8"), heap.array((8 * 256 * 128 * 2,), "uint8")
    raises_cpp("hmoe: w13 has shape [8, 256, 256]: expected [8, 256, 128]", hmoe.prepare_weights,
               hmoe.Spec(8, 2, 128, 128), w13, w2, w13_out, w2_out, 0)
    raises_cpp("hmoe: w2 has shape [8, 128, 256]: expected [8, 256, 128]", hmoe.prepare_weights, spec, w13,
               heap.array((8, 128, 256)), w13_out, w2_out, 0)
    raises_cpp("hmoe: w13 has dtype float32: expected bfloat16", hmoe.prepare_weights, spec,
               heap.array((8, 256, 256), "float32"), w2, w13_out, w2_out, 0)
    raises_cpp("hmoe: w13_out holds 16 bytes: expected at least 1048576", hmoe.prepare_weights, spec, w13, w2,
               heap.array((16,), "uint8"), w2_out, 0)
    raises_cpp("hmoe: invalid MoeSpec.hidden = 250: expected a multiple of 64 in 64..65536", hmoe.prepare_weights,
               hmoe.Spec(8, 2, 250, 128), w13, w2, w13_out, w2_out, 0)
    raises_cpp("hmoe: prepare_weights: w13_dst must not alias w13_src (rows are regrouped)", hmoe.prepare_weights,
               spec, w13, w2, FakeArray((8 * 256 * 256 * 2,), "uint8", address=w13.address), w2_out, 0)


class Fp8Layer(Layer):
    """Layer with fp8-block weights: prepared buffers of 1 byte per weight and fp32 block scales."""

    def __init__(self, scheme="fp8-block", tokens=4):
        self.spec = hmoe.Spec(8, 2, 256, 128, weight_dtype="fp8-e4m3", scheme=scheme)
        self.runner = hmoe.Runner(self.spec, 16)
        heap = FakeHeap()
        w13_bytes, w2_bytes = hmoe.prepared_weight_bytes(self.spec)
        self.args = dict(
            x=heap.array((tokens, 256)),
            out=heap.array((tokens, 256)),
            w13=heap.array((w13_bytes,), "uint8"),
            w2=heap.array((w2_bytes,), "uint8"),
            topk_ids=heap.array((tokens, 2), "int32"),
            topk_weights=heap.array((tokens, 2), "float32"),
            workspace=heap.array((self.runner.workspace_bytes,), "uint8"),
            stream=0,
            w13_scale=heap.array(hmoe.weight_scale_shape(self.spec, "w13"), "float32"),
            w2_scale=heap.array(hmoe.weight_scale_shape(self.spec, "w2"), "float32"),
        )
        self.heap = heap


@pytest.mark.parametrize("change, message", [
    (lambda h: dict(w13_scale=h.array((8,), "float32")), "hmoe: w13_scale has shape [8]: expected [8, 2, 2]"),
    (lambda h: dict(w2_scale=h.array((8, 2, 1))), "hmoe: w2_scale has dtype bfloat16: expected float32"),
    (lambda h: dict(w2_scale=FakeArray((8, 2, 1), "float32", device_id=1)),
     "hmoe: w2_scale is on cuda:1: expected cuda:0 like the other arrays of the call"),
    (lambda h: dict(w13_scale=None), "hmoe: RunArgs.weights.w13_scale is null: expected a device pointer"),
    (lambda h: dict(w2_scale=None), "hmoe: RunArgs.weights.w2_scale is null: expected a device pointer"),
    (lambda h: dict(act_scale=h.array((1,), "float32")),
     "hmoe: RunArgs.act_scale/intermediate_act_scale are set for scheme fp8-block: expected nullptr (static "
     "activation scales exist for fp8-tensor only)"),
])
def test_fp8_run_arguments(change, message):
    layer = Fp8Layer()
    raises_cpp(message, layer.run_topk, **change(layer.heap))


def test_fp8_tensor_act_scales_and_bf16_layers():
    layer = Fp8Layer("fp8-tensor")
    heap = layer.heap
    raises_cpp("hmoe: act_scale has shape [2]: expected [1]", layer.run_topk, act_scale=heap.array((2,), "float32"))
    raises_cpp("hmoe: intermediate_act_scale has dtype bfloat16: expected float32", layer.run_logits,
               heap.array((4, 8), "float32"), intermediate_act_scale=heap.array((1,)))
    raises_cpp("hmoe: w13_scale has shape [8, 2, 2]: expected [8]", layer.run_topk,
               w13_scale=heap.array((8, 2, 2), "float32"))
    bf16 = Layer()
    raises_cpp("hmoe: RunArgs.weights.w13_scale/w2_scale are set for a bf16 layer: expected nullptr (FP8 only)",
               bf16.run_topk, w13_scale=bf16.heap.array((8,), "float32"))


def test_torch_module_needs_torch():
    try:
        import torch
    except ImportError:
        with pytest.raises(ImportError):
            importlib.import_module("hmoe.torch")
        pytest.skip("PyTorch is not installed: hmoe.torch is tested by test_torch.py where it is")
    importlib.import_module("hmoe.torch")  # registers the ops
    assert hasattr(torch.ops.hmoe, "fused_experts") and hasattr(torch.ops.hmoe, "fused_moe")
