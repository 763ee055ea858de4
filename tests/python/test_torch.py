"""hmoe.torch against an eager PyTorch reference (float64), eagerly, under torch.compile and under
CUDA-graph capture, with every tensor from PyTorch's allocator. The argument checks that need no
device run wherever PyTorch is installed; the rest needs a Hopper GPU (sm_90a)."""

import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: hmoe.torch is tested where it is")

import hmoe  # noqa: E402
import hmoe.torch as hmoe_torch  # noqa: E402


def _div_rn(values: torch.Tensor, divisor: float) -> torch.Tensor:
    """values / divisor correctly rounded, as hmoe divides. NOTE: PyTorch's CUDA division by a Python
    scalar multiplies by the reciprocal, which differs in the last bit for some values (seen on H200:
    every scale test failed with `amax / 448.0`); a tensor divisor divides."""
    return values / torch.full_like(values, divisor)


def _no_hopper_reason():
    if not torch.cuda.is_available():
        return "no CUDA device: the GPU tests of hmoe.torch skip"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"hmoe's kernels are built for sm_90a; this device is sm_{major}{minor}"
    return None


NO_HOPPER = _no_hopper_reason()
gpu = pytest.mark.skipif(NO_HOPPER is not None, reason=NO_HOPPER or "")

TOLERANCE = 1e-2  # DESIGN.md §2: the BF16 path against a float64 reference on the same inputs
# The FP8 path against a float64 reference that quantises the same way (same e4m3 weights and scales,
# activations quantised with the scheme's groups): what is left is fp32 accumulation and the
# rounding of values that sit near an e4m3 rounding boundary.
FP8_TOLERANCE = 2e-2
FP8_SCHEMES = ("fp8-tensor", "fp8-channel", "fp8-block")
SMALL = dict(num_experts=8, top_k=2, hidden=256, intermediate=128)
QWEN3_30B = dict(num_experts=128, top_k=8, hidden=2048, intermediate=768)


# ---- Inputs and the reference -----------------------------------------------------------------------

def make_weights(num_experts, hidden, intermediate, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * intermediate, hidden, device="cuda", generator=generator) / hidden ** 0.5
    w2 = torch.randn(num_experts, hidden, intermediate, device="cuda", generator=generator) / intermediate ** 0.5
    return w13.to(torch.bfloat16), w2.to(torch.bfloat16)


def make_tokens(num_tokens, hidden, num_experts, seed=1):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(num_tokens, hidden, device="cuda", generator=generator).to(torch.bfloat16)
    logits = torch.randn(num_tokens, num_experts, device="cuda", generator=generator)
    return x, logits


def reference_softmax_topk(logits, top_k, renormalize):
    """Softmax top-k; ties go to the lower expert index (a stable descending sort)."""
    probs = torch.softmax(logits.double(), dim=-1)
    ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = probs.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights.float(), ids.to(torch.int32)


def reference_grouped_topk(logits, bias, top_k, num_groups, topk_groups, scale):
    """DeepSeek-V3: sigmoid + bias, best groups by their top-2 sum, top-k inside, normalise, scale."""
    scores = torch.sigmoid(logits.double())
    choice = scores + bias.double()
    tokens, experts = choice.shape
    group_scores = choice.view(tokens, num_groups, -1).topk(2, dim=-1).values.sum(-1)
    kept = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices[:, :topk_groups]
    mask = torch.zeros(tokens, num_groups, dtype=torch.bool, device=logits.device).scatter_(1, kept, True)
    choice = choice.masked_fill(~mask.repeat_interleave(experts // num_groups, dim=1), float("-inf"))
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, ids)
    weights = weights / weights.sum(-1, keepdim=True) * scale
    return weights.float(), ids.to(torch.int32)


def reference_experts(x, w13, w2, topk_weights, topk_ids):
    """out[t] = Σ_j w[t,j] · W2[e] · (silu(W1[e]·x_t) ⊙ W3[e]·x_t), in float64."""
    intermediate = w2.shape[2]
    x64 = x.double()
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for expert in range(w13.shape[0]):
        token, slot = (topk_ids == expert).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        h = x64[token] @ w13[expert].double().T
        y = (torch.nn.functional.silu(h[:, :intermediate]) * h[:, intermediate:]) @ w2[expert].double().T
        out.index_add_(0, token, y * topk_weights[token, slot].double()[:, None])
    return out


# ---- The FP8 reference: vLLM's W8A8 schemes emulated in PyTorch ----------------------------------------

def dequantize_weights(values, scales, scheme):
    """e4m3 values [E, N, K] × their scales broadcast over the scheme's groups, in float64."""
    experts, rows, cols = values.shape
    scales = scales.double()
    if scheme == "fp8-tensor":
        scales = scales.view(experts, 1, 1)
    elif scheme == "fp8-channel":
        scales = scales.view(experts, rows, 1)
    else:
        scales = scales.repeat_interleave(128, 1)[:, :rows].repeat_interleave(128, 2)[:, :, :cols]
    return values.double() * scales


def fake_quantize_activations(rows, scheme, static_scale=None):
    """rows [M, K] float32 quantised as hmoe does (scale = amax / 448 per group, a zero group gets 1,
    value = e4m3(v / scale) saturated), returned dequantised in float64. Groups: the whole tensor
    (fp8-tensor; static_scale when given), one row (fp8-channel), 1×128 (fp8-block)."""
    num_rows, cols = rows.shape
    if num_rows == 0:
        return rows.double()
    if scheme == "fp8-block":
        groups = rows.reshape(num_rows, cols // 128, 128)
    elif scheme == "fp8-channel":
        groups = rows.reshape(num_rows, 1, cols)
    else:
        groups = rows.reshape(1, 1, num_rows * cols)
    if static_scale is not None:
        scale = static_scale.float().reshape(1, 1, 1)
    else:
        amax = groups.abs().amax(-1, keepdim=True)
        scale = torch.where(amax == 0, torch.ones_like(amax), _div_rn(amax, 448.0))  # a float32 division, as hmoe's
    values = (groups / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return (values.double() * scale.double()).reshape(num_rows, cols)


def reference_fp8_experts(x, w13, w13_scale, w2, w2_scale, scheme, topk_weights, topk_ids, a1_scale=None,
                          a2_scale=None):
    """The FP8 layer in float64 on dequantised values: x quantised with the scheme, GEMM1, SwiGLU
    rounded to bf16 (as hmoe stores it) and quantised again, GEMM2, weighted sum. A dynamic
    per-tensor scale of the SwiGLU output covers every routed (token, slot) row."""
    num_experts, intermediate = w13.shape[0], w2.shape[2]
    w13_values = dequantize_weights(w13, w13_scale, scheme)
    w2_values = dequantize_weights(w2, w2_scale, scheme)
    xq = fake_quantize_activations(x.float(), scheme, a1_scale)
    valid = (topk_ids >= 0) & (topk_ids < num_experts)
    token, slot = valid.nonzero(as_tuple=True)
    expert = topk_ids[token, slot].long()
    swiglu = torch.zeros(token.numel(), intermediate, dtype=torch.float32, device=x.device)
    for e in range(num_experts):
        rows = (expert == e).nonzero(as_tuple=True)[0]
        if rows.numel():
            h = xq[token[rows]] @ w13_values[e].T
            swiglu[rows] = (torch.nn.functional.silu(h[:, :intermediate]) * h[:, intermediate:]).float()
    swiglu_q = fake_quantize_activations(swiglu.bfloat16().float(), scheme, a2_scale)
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in range(num_experts):
        rows = (expert == e).nonzero(as_tuple=True)[0]
        if rows.numel():
            y = swiglu_q[rows] @ w2_values[e].T
            out.index_add_(0, token[rows], y * topk_weights[token[rows], slot[rows]].double()[:, None])
    return out


def relative_error(out, ref):
    assert not torch.isnan(out).any(), "NaN in hmoe's output"
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module")
def small_layer():
    w13, w2 = make_weights(SMALL["num_experts"], SMALL["hidden"], SMALL["intermediate"])
    return w13, w2, hmoe_torch.prepare_weights(w13, w2)


@pytest.fixture(scope="module")
def qwen_layer():
    w13, w2 = make_weights(QWEN3_30B["num_experts"], QWEN3_30B["hidden"], QWEN3_30B["intermediate"])
    return w13, w2, hmoe_torch.prepare_weights(w13, w2)


_fp8_layers: dict = {}


def fp8_layer(layer_name, scheme):
    """(w13, w13_scale, w2, w2_scale, prepared) quantised by hmoe from the bf16 layer, cached per test module."""
    key = (layer_name, scheme)
    if key not in _fp8_layers:
        dims = SMALL if layer_name == "small" else QWEN3_30B
        w13, w2 = make_weights(dims["num_experts"], dims["hidden"], dims["intermediate"], seed=40)
        w13_q, w13_scale = hmoe_torch.quantize_weights(w13, scheme)
        w2_q, w2_scale = hmoe_torch.quantize_weights(w2, scheme)
        block_shape = [128, 128] if scheme == "fp8-block" else None
        prepared = hmoe_torch.prepare_weights(w13_q, w2_q, w13_scale, w2_scale, block_shape=block_shape)
        _fp8_layers[key] = (w13_q, w13_scale, w2_q, w2_scale, prepared)
    return _fp8_layers[key]


def fp8_kwargs(scheme, w13_scale=None, w2_scale=None):
    kwargs = dict(quant="fp8_w8a8", w1_scale=w13_scale, w2_scale=w2_scale)
    if scheme == "fp8-block":
        kwargs["block_shape"] = [128, 128]
    return kwargs


def poisoned_out(x):
    return torch.full_like(x, float("nan"))


# ---- Checks that need no device --------------------------------------------------------------------

class TestArguments:
    def make(self, dtype=torch.bfloat16):
        x = torch.zeros(4, 256, dtype=torch.bfloat16)
        w13 = torch.zeros(8, 256, 256, dtype=dtype)
        w2 = torch.zeros(8, 256, 128, dtype=dtype)
        return x, w13, w2, torch.ones(4, 2), torch.zeros(4, 2, dtype=torch.int32)

    def test_other_activations_and_quant_types_are_not_supported(self):
        with pytest.raises(NotImplementedError, match="activation='gelu'"):
            hmoe_torch.fused_experts(*self.make(), activation="gelu")
        with pytest.raises(NotImplementedError, match="quant='int8_w8a8' is not supported"):
            hmoe_torch.fused_experts(*self.make(), quant="int8_w8a8")
        with pytest.raises(NotImplementedError, match=r"block_shape=\[64, 64\] is not supported"):
            hmoe_torch.fused_experts(*self.make(torch.float8_e4m3fn), quant="fp8_w8a8", w1_scale=torch.ones(8, 4, 4),
                                     w2_scale=torch.ones(8, 4, 2), block_shape=[64, 64])

    def test_weight_shapes(self):
        x, w13, w2, weights, ids = self.make()
        with pytest.raises(ValueError, match=r"hmoe: w2 has shape \[8, 128, 256\]: expected \[E=8, H=256, I=128\]"):
            hmoe_torch.fused_experts(x, w13, w2.transpose(1, 2), weights, ids)
        with pytest.raises(ValueError, match=r"hmoe: w1 has shape \[8, 255, 256\]"):
            hmoe_torch.fused_experts(x, w13[:, :255], w2, weights, ids)

    def test_host_tensors_are_rejected(self):
        with pytest.raises(ValueError, match="hmoe: tensors are on cpu: expected CUDA tensors"):
            hmoe_torch.fused_experts(*self.make())

    def test_routing_arguments(self):
        x, w13, w2, _, _ = self.make()
        logits = torch.zeros(4, 8)
        with pytest.raises(ValueError, match="needs num_expert_group and topk_group"):
            hmoe_torch.fused_moe(x, logits, w13, w2, 2, True, use_grouped_topk=True)
        with pytest.raises(NotImplementedError, match="renormalize=False is not supported"):
            hmoe_torch.fused_moe(x, logits, w13, w2, 2, False, use_grouped_topk=True, num_expert_group=2,
                                 topk_group=1)
        with pytest.raises(NotImplementedError, match="grouped routing"):
            hmoe_torch.fused_moe(x, logits, w13, w2, 2, True, routed_scaling_factor=2.5)

    def test_ops_are_registered(self):
        assert hasattr(torch.ops.hmoe, "fused_experts") and hasattr(torch.ops.hmoe, "fused_moe")


class TestFp8Arguments:
    """vLLM's FP8 arguments read into hmoe's schemes, and every mismatch named; on host tensors, so a
    call whose arguments are right stops at the device check."""

    E, H, I = 8, 256, 128

    def make(self):
        x = torch.zeros(4, self.H, dtype=torch.bfloat16)
        w13 = torch.zeros(self.E, 2 * self.I, self.H, dtype=torch.float8_e4m3fn)
        w2 = torch.zeros(self.E, self.H, self.I, dtype=torch.float8_e4m3fn)
        return x, w13, w2, torch.ones(4, 2), torch.zeros(4, 2, dtype=torch.int32)

    def call(self, **kwargs):
        return hmoe_torch.fused_experts(*self.make(), **{"quant": "fp8_w8a8", **kwargs})

    @pytest.mark.parametrize("w1_scale, w2_scale, block_shape, scheme", [
        ((8,), (8,), None, "fp8-tensor"),
        ((8, 1, 1), (8, 1), None, "fp8-tensor"),
        ((8, 256), (8, 256), None, "fp8-channel"),
        ((8, 256, 1), (8, 256, 1), None, "fp8-channel"),
        ((8, 2, 2), (8, 2, 1), [128, 128], "fp8-block"),
        ((8, 2, 2), (8, 2, 1), (128, 128), "fp8-block"),
    ])
    def test_scheme_follows_the_scale_shapes(self, w1_scale, w2_scale, block_shape, scheme):
        scales = (torch.ones(w1_scale), torch.ones(w2_scale))
        assert hmoe_torch._fp8_scheme(self.E, self.H, self.I, *scales, block_shape) == scheme
        found, w13_scale, w2_scale = hmoe_torch._fp8_weight_scales(self.E, self.H, self.I, *scales, block_shape)
        assert found == scheme and w13_scale.dtype == w2_scale.dtype == torch.float32
        assert list(w13_scale.shape) == hmoe_torch._scale_shape(scheme, self.E, 2 * self.I, self.H)
        assert list(w2_scale.shape) == hmoe_torch._scale_shape(scheme, self.E, self.H, self.I)
        # The arguments pass every check; only the host tensors stop the call.
        with pytest.raises(ValueError, match="hmoe: tensors are on cpu: expected CUDA tensors"):
            self.call(w1_scale=scales[0], w2_scale=scales[1], block_shape=block_shape)

    @pytest.mark.parametrize("kwargs, error, message", [
        (dict(), ValueError, r"FP8 weights need w1_scale"),
        (dict(w1_scale=torch.ones(8)), ValueError, r"FP8 weights need w2_scale"),
        (dict(w1_scale=torch.ones(3), w2_scale=torch.ones(8)), ValueError,
         r"w1_scale has shape \[3\]: expected E=8 values \(fp8-tensor: \[E\]\) or E\*2I=2048 values"),
        (dict(w1_scale=torch.ones(8), w2_scale=torch.ones(8, 256)), ValueError,
         r"w2_scale has shape \[8, 256\]: expected \[8\] for fp8-tensor"),
        (dict(w1_scale=torch.ones(8, 256), w2_scale=torch.ones(8, 128)), ValueError,
         r"w2_scale has shape \[8, 128\]: expected \[8, 256\] for fp8-channel"),
        (dict(w1_scale=torch.ones(8, 2, 2), w2_scale=torch.ones(8, 1, 2), block_shape=[128, 128]), ValueError,
         r"w2_scale has shape \[8, 1, 2\]: expected \[8, 2, 1\] for fp8-block"),
        (dict(w1_scale=torch.ones(8), w2_scale=torch.ones(8), block_shape=[128, 128]), ValueError,
         r"w1_scale has shape \[8\]: expected \[8, 2, 2\] for fp8-block"),
        (dict(w1_scale=torch.ones(8, dtype=torch.int32), w2_scale=torch.ones(8)), TypeError,
         r"w1_scale has dtype torch.int32: expected float32 scales"),
        (dict(w1_scale=[1.0] * 8, w2_scale=torch.ones(8)), TypeError, r"w1_scale must be a tensor"),
        (dict(w1_scale=torch.ones(8, 256), w2_scale=torch.ones(8, 256), a1_scale=torch.ones(1)), ValueError,
         r"a1_scale is a static per-tensor activation scale, but the scales describe fp8-channel"),
        (dict(w1_scale=torch.ones(8, 2, 2), w2_scale=torch.ones(8, 2, 1), block_shape=[128, 128],
              a2_scale=torch.ones(1)), ValueError, r"a2_scale is a static per-tensor .* describe fp8-block"),
        (dict(w1_scale=torch.ones(8), w2_scale=torch.ones(8), a1_scale=torch.ones(2)), ValueError,
         r"a1_scale has shape \[2\] and dtype torch.float32: expected one float value"),
    ])
    def test_mismatches_are_named(self, kwargs, error, message):
        with pytest.raises(error, match="^hmoe: " + message):
            self.call(**kwargs)

    def test_static_per_tensor_activation_scales_pass(self):
        with pytest.raises(ValueError, match="tensors are on cpu"):
            self.call(w1_scale=torch.ones(8), w2_scale=torch.ones(8), a1_scale=torch.ones(()),
                      a2_scale=torch.ones(1, 1, dtype=torch.bfloat16))

    def test_quant_and_weights_must_agree(self):
        x, w13, w2, weights, ids = self.make()
        with pytest.raises(ValueError, match=r"^hmoe: w1 holds torch.float8_e4m3fn weights: pass quant='fp8_w8a8'"):
            hmoe_torch.fused_experts(x, w13, w2, weights, ids)
        bf16 = (w13.to(torch.bfloat16), w2.to(torch.bfloat16))
        with pytest.raises(TypeError, match=r"^hmoe: quant='fp8_w8a8' needs torch.float8_e4m3fn w1 and w2"):
            hmoe_torch.fused_experts(x, *bf16, weights, ids, quant="fp8_w8a8", w1_scale=torch.ones(8),
                                     w2_scale=torch.ones(8))
        with pytest.raises(TypeError, match=r"^hmoe: w2 has dtype torch.bfloat16: expected torch.float8_e4m3fn"):
            hmoe_torch.fused_experts(x, w13, bf16[1], weights, ids, quant="fp8_w8a8")
        for name in ("w1_scale", "w2_scale", "a1_scale", "block_shape"):
            value = [128, 128] if name == "block_shape" else torch.ones(8)
            with pytest.raises(ValueError, match=f"^hmoe: {name} is given with quant=None"):
                hmoe_torch.fused_experts(x, *bf16, weights, ids, **{name: value})
        with pytest.raises(TypeError, match=r"needs torch.float8_e4m3fn"):
            hmoe_torch.fused_experts(x, w13.to(torch.float8_e5m2), w2.to(torch.float8_e5m2), weights, ids,
                                     quant="fp8_w8a8", w1_scale=torch.ones(8), w2_scale=torch.ones(8))

    def test_fused_moe_takes_the_same_arguments(self):
        x, w13, w2, _, _ = self.make()
        logits = torch.zeros(4, 8)
        with pytest.raises(ValueError, match=r"^hmoe: w2_scale has shape \[8, 2, 2\]: expected \[8, 2, 1\]"):
            hmoe_torch.fused_moe(x, logits, w13, w2, 2, True, quant="fp8_w8a8", w1_scale=torch.ones(8, 2, 2),
                                 w2_scale=torch.ones(8, 2, 2), block_shape=[128, 128])
        with pytest.raises(ValueError, match="tensors are on cpu"):
            hmoe_torch.fused_moe(x, logits, w13, w2, 2, True, quant="fp8_w8a8", w1_scale=torch.ones(8),
                                 w2_scale=torch.ones(8), a1_scale=torch.ones(1))

    def test_prepare_weights_needs_the_scales(self):
        _, w13, w2, _, _ = self.make()
        with pytest.raises(ValueError, match="^hmoe: FP8 weights need w1_scale"):
            hmoe_torch.prepare_weights(w13, w2)
        with pytest.raises(ValueError, match=r"^hmoe: w1_scale has shape \[8\]: expected \[8, 2, 2\]"):
            hmoe_torch.prepare_weights(w13, w2, torch.ones(8), torch.ones(8), block_shape=[128, 128])
        with pytest.raises(ValueError, match="tensors are on cpu"):
            hmoe_torch.prepare_weights(w13, w2, torch.ones(8, 2, 2), torch.ones(8, 2, 1), block_shape=[128, 128])
        with pytest.raises(ValueError, match="^hmoe: w1_scale is given with quant=None"):
            hmoe_torch.prepare_weights(w13.to(torch.bfloat16), w2.to(torch.bfloat16), torch.ones(8), torch.ones(8))

    def test_prepared_weights_carry_their_scheme(self):
        x, _, _, weights, ids = self.make()
        prepared = hmoe_torch.PreparedWeights(torch.zeros(8, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint8),
                                              self.E, self.H, self.I, "fp8-block", torch.ones(8, 2, 2),
                                              torch.ones(8, 2, 1))
        assert "scheme='fp8-block'" in repr(prepared)
        with pytest.raises(ValueError, match=r"^hmoe: w1 holds fp8 e4m3 weights: pass quant='fp8_w8a8'"):
            hmoe_torch.fused_experts(x, prepared, None, weights, ids)
        with pytest.raises(ValueError, match=r"^hmoe: w1_scale and w2_scale describe fp8-tensor, but w1 was "
                                             r"prepared for fp8-block"):
            hmoe_torch.fused_experts(x, prepared, None, weights, ids, quant="fp8_w8a8", w1_scale=torch.ones(8),
                                     w2_scale=torch.ones(8))
        # Its own scales and scheme need no repeating; a block_shape given anyway must agree.
        for block_shape in (None, [128, 128]):
            with pytest.raises(ValueError, match="tensors are on cpu"):
                hmoe_torch.fused_experts(x, prepared, None, weights, ids, quant="fp8_w8a8", block_shape=block_shape)
        per_tensor = hmoe_torch.PreparedWeights(prepared.w13, prepared.w2, self.E, self.H, self.I, "fp8-tensor",
                                                torch.ones(8), torch.ones(8))
        with pytest.raises(ValueError, match=r"^hmoe: block_shape=\[128, 128\] does not match w1, prepared for "
                                             r"fp8-tensor"):
            hmoe_torch.fused_experts(x, per_tensor, None, weights, ids, quant="fp8_w8a8", block_shape=[128, 128])

    @pytest.mark.parametrize("kwargs, error, message", [
        (dict(scheme="fp8-row"), ValueError, r"scheme='fp8-row': expected one of 'fp8-tensor'"),
        (dict(w=torch.zeros(8, 256, 128)), TypeError, r"w has dtype torch.float32: expected torch.bfloat16"),
        (dict(w=torch.zeros(256, 128, dtype=torch.bfloat16)), ValueError, r"w has shape \[256, 128\]"),
        (dict(w=torch.zeros(8, 256, 192, dtype=torch.bfloat16)), ValueError,
         r"w has shape \[8, 256, 192\]: expected \[E, N, K\] with N and K multiples of 128 for fp8-block"),
        (dict(), ValueError, r"tensors are on cpu"),
    ])
    def test_quantize_weights_arguments(self, kwargs, error, message):
        args = {"w": torch.zeros(8, 256, 128, dtype=torch.bfloat16), "scheme": "fp8-block", **kwargs}
        with pytest.raises(error, match="^hmoe: " + message):
            hmoe_torch.quantize_weights(args["w"], args["scheme"])

    def test_op_schemas_take_the_fp8_arguments(self):
        for op in (torch.ops.hmoe.fused_experts.default, torch.ops.hmoe.fused_moe.default):
            schema = str(op._schema)
            for argument in ("Tensor? w13_scale=None", "Tensor? w2_scale=None", "Tensor? act_scale=None",
                             "Tensor? intermediate_act_scale=None", 'str scheme="none"'):
                assert argument in schema, schema
            assert schema.startswith(op._schema.name) and "Tensor(a0!) out" in schema

    def test_fake_implementations_accept_fp8_arguments(self):
        meta = dict(device="meta")
        x = torch.empty(4, self.H, dtype=torch.bfloat16, **meta)
        w13 = torch.empty(self.E * 2 * self.I * self.H, dtype=torch.uint8, **meta)
        w2 = torch.empty(self.E * self.H * self.I, dtype=torch.uint8, **meta)
        scales = (torch.empty(self.E, **meta), torch.empty(self.E, **meta), torch.empty(1, **meta),
                  torch.empty(1, **meta))
        ids = torch.empty(4, 2, dtype=torch.int32, **meta)
        torch.ops.hmoe.fused_experts(torch.empty_like(x), x, w13, w2, torch.empty(4, 2, **meta), ids, self.E,
                                     self.I, True, *scales, "fp8-tensor")
        torch.ops.hmoe.fused_moe(torch.empty_like(x), x, torch.empty(4, self.E, **meta), w13, w2, None, 2, True,
                                 False, 1, 1, 1.0, self.E, self.I, True, *scales, "fp8-tensor")


# ---- Results against the reference -----------------------------------------------------------------

@gpu
@pytest.mark.parametrize("layer_name, num_tokens", [("small", 1), ("small", 7), ("small", 200), ("qwen", 1),
                                                    ("qwen", 64), ("qwen", 333), ("qwen", 4096)])
def test_fused_experts_matches_reference(layer_name, num_tokens, small_layer, qwen_layer):
    w13, w2, prepared = small_layer if layer_name == "small" else qwen_layer
    top_k = SMALL["top_k"] if layer_name == "small" else QWEN3_30B["top_k"]
    x, logits = make_tokens(num_tokens, w13.shape[2], w13.shape[0], seed=num_tokens)
    topk_weights, topk_ids = reference_softmax_topk(logits, top_k, renormalize=True)
    out = hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids, out=poisoned_out(x))
    error = relative_error(out, reference_experts(x, w13, w2, topk_weights, topk_ids))
    print(f"fused_experts {layer_name} T={num_tokens}: rel error {error:.2e}")
    assert error <= TOLERANCE


@gpu
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [True, False])
def test_fused_moe_softmax_matches_reference(qwen_layer, logits_dtype, renormalize):
    w13, w2, prepared = qwen_layer
    x, logits = make_tokens(100, 2048, 128, seed=7)
    logits = logits.to(logits_dtype)
    out = hmoe_torch.fused_moe(x, logits, prepared, None, 8, renormalize, out=poisoned_out(x))
    topk_weights, topk_ids = reference_softmax_topk(logits, 8, renormalize)
    error = relative_error(out, reference_experts(x, w13, w2, topk_weights, topk_ids))
    print(f"fused_moe softmax {logits_dtype} renormalize={renormalize}: rel error {error:.2e}")
    assert error <= TOLERANCE


@gpu
def test_fused_moe_grouped_matches_reference():
    experts, hidden, intermediate = 64, 256, 128
    w13, w2 = make_weights(experts, hidden, intermediate, seed=3)
    prepared = hmoe_torch.prepare_weights(w13, w2)
    x, logits = make_tokens(50, hidden, experts, seed=4)
    bias = torch.randn(experts, device="cuda") * 0.1
    out = hmoe_torch.fused_moe(x, logits, prepared, None, 8, True, use_grouped_topk=True, num_expert_group=8,
                               topk_group=4, e_score_correction_bias=bias, routed_scaling_factor=2.5)
    topk_weights, topk_ids = reference_grouped_topk(logits, bias, 8, 8, 4, 2.5)
    error = relative_error(out, reference_experts(x, w13, w2, topk_weights, topk_ids))
    print(f"fused_moe grouped: rel error {error:.2e}")
    assert error <= TOLERANCE


@gpu
def test_out_preallocated_in_place_and_converted_inputs(small_layer):
    w13, w2, prepared = small_layer
    x, logits = make_tokens(33, 256, 8, seed=5)
    topk_weights, topk_ids = reference_softmax_topk(logits, 2, renormalize=True)
    expected = hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids)
    out = torch.empty_like(x)
    assert hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids, out=out) is out
    assert torch.equal(out, expected)
    # vLLM passes int64 ids from torch.topk and sometimes bf16 weights: converted, same result.
    converted = hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids.long())
    assert torch.equal(converted, expected)
    in_place = x.clone()
    hmoe_torch.fused_experts(in_place, prepared, None, topk_weights, topk_ids, out=in_place)
    assert torch.equal(in_place, expected)
    empty = hmoe_torch.fused_experts(x[:0], prepared, None, topk_weights[:0], topk_ids[:0])
    assert empty.shape == (0, 256)


@gpu
def test_raw_weights_prepare_each_call_and_warn_once(small_layer):
    w13, w2, prepared = small_layer
    x, logits = make_tokens(9, 256, 8, seed=6)
    topk_weights, topk_ids = reference_softmax_topk(logits, 2, renormalize=True)
    hmoe_torch._raw_weights_warned = False
    with pytest.warns(UserWarning, match="prepare_weights"):
        raw = hmoe_torch.fused_experts(x, w13, w2, topk_weights, topk_ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = hmoe_torch.fused_experts(x, w13, w2, topk_weights, topk_ids)
    assert torch.equal(raw, hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids))
    assert torch.equal(raw, again)


@gpu
def test_cpp_errors_surface_with_their_message(small_layer):
    _, _, prepared = small_layer
    x, logits = make_tokens(4, 256, 8)
    topk_weights, topk_ids = reference_softmax_topk(logits, 2, renormalize=True)
    with pytest.raises(hmoe.InvalidArgumentError, match=r"^hmoe: x has dtype float16: expected bfloat16$"):
        hmoe_torch.fused_experts(x.half(), prepared, None, topk_weights, topk_ids)
    with pytest.raises(hmoe.InvalidArgumentError, match=r"^hmoe: topk_weights has shape \[4, 2\]: expected \[4, 3\]$"):
        hmoe_torch.fused_experts(x, prepared, None, topk_weights, torch.zeros(4, 3, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match=r"^hmoe: invalid MoeSpec.top_k = 0: expected 1..min\(num_experts=8, 32\)$"):
        hmoe_torch.fused_moe(x, logits, prepared, None, 0, True)
    with pytest.raises(ValueError, match=r"^hmoe: router_logits has shape \[4, 8\]: expected \[3, 8\]$"):
        hmoe_torch.fused_moe(x[:3], logits, prepared, None, 2, True)
    with pytest.raises(ValueError, match=r"^hmoe: out has shape \[4, 128\]"):
        hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids, out=x[:, :128].contiguous())


@gpu
def test_runs_on_the_current_stream(qwen_layer):
    _, _, prepared = qwen_layer
    x, logits = make_tokens(64, 2048, 128, seed=8)
    expected = hmoe_torch.fused_moe(x, logits, prepared, None, 8, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = hmoe_torch.fused_moe(x, logits, prepared, None, 8, True)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out, expected)


# ---- FP8 against the emulated reference -------------------------------------------------------------

@gpu
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_quantize_weights_matches_torch(scheme, ue8m0):
    """hmoe's GPU quantiser gives exactly the values and scales of the same arithmetic in PyTorch."""
    w13, _ = make_weights(8, 256, 128, seed=41)
    w13[1] = 0  # an all-zero expert: scale 1, values 0
    values, scales = hmoe_torch.quantize_weights(w13, scheme, ue8m0_scales=ue8m0)
    assert values.dtype == torch.float8_e4m3fn and values.shape == w13.shape and scales.dtype == torch.float32
    experts, rows, cols = w13.shape
    if scheme == "fp8-tensor":
        groups = w13.float().reshape(experts, 1, 1, rows * cols)
    elif scheme == "fp8-channel":
        groups = w13.float().reshape(experts, rows, 1, cols)
    else:
        groups = w13.float().reshape(experts, rows // 128, 128, cols // 128, 128).transpose(2, 3).reshape(
            experts, rows // 128, cols // 128, 128 * 128)
    amax = groups.abs().amax(-1)
    expected_scales = torch.where(amax == 0, torch.ones_like(amax), _div_rn(amax, 448.0))
    if ue8m0:
        mantissa, exponent = torch.frexp(expected_scales)
        expected_scales = torch.where(mantissa == 0.5, expected_scales, torch.ldexp(torch.ones_like(expected_scales), exponent))
        assert torch.equal(torch.exp2(torch.round(torch.log2(scales))), scales), "UE8M0 scales are powers of two"
    assert torch.equal(scales.reshape(expected_scales.shape), expected_scales)
    assert torch.equal(scales[1], torch.ones_like(scales[1]))
    expected_values = (w13.float() / dequantize_weights(torch.ones_like(values, dtype=torch.float32), scales,
                                                        scheme).float()).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(values.view(torch.uint8), expected_values.view(torch.uint8))
    error = relative_error(dequantize_weights(values, scales, scheme), w13.double())
    print(f"quantize_weights {scheme} ue8m0={ue8m0}: scales {list(scales.shape)}, weight rel error {error:.2e}")
    assert error < 0.07


@gpu
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
@pytest.mark.parametrize("layer_name, num_tokens", [("small", 7), ("small", 200), ("qwen", 1), ("qwen", 64),
                                                    ("qwen", 333)])
def test_fp8_fused_experts_matches_reference(scheme, layer_name, num_tokens):
    w13, w13_scale, w2, w2_scale, prepared = fp8_layer(layer_name, scheme)
    dims = SMALL if layer_name == "small" else QWEN3_30B
    x, logits = make_tokens(num_tokens, dims["hidden"], dims["num_experts"], seed=num_tokens)
    topk_weights, topk_ids = reference_softmax_topk(logits, dims["top_k"], renormalize=True)
    out = hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids, quant="fp8_w8a8", out=poisoned_out(x))
    ref = reference_fp8_experts(x, w13, w13_scale, w2, w2_scale, scheme, topk_weights, topk_ids)
    error = relative_error(out, ref)
    # For scale: the same fp8 weights with unquantised activations.
    weights_only = reference_experts(x, dequantize_weights(w13, w13_scale, scheme),
                                     dequantize_weights(w2, w2_scale, scheme), topk_weights, topk_ids)
    print(f"fused_experts {scheme} {layer_name} T={num_tokens}: rel error {error:.2e} against the FP8 reference "
          f"({relative_error(out, weights_only):.2e} against unquantised activations)")
    assert error <= FP8_TOLERANCE


@gpu
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_fp8_raw_weights_and_vllm_scale_shapes(scheme):
    """Raw fp8 w1/w2 with vLLM's scale tensors give the bits of the prepared layer."""
    w13, w13_scale, w2, w2_scale, prepared = fp8_layer("small", scheme)
    x, logits = make_tokens(33, 256, 8, seed=42)
    topk_weights, topk_ids = reference_softmax_topk(logits, 2, renormalize=True)
    expected = hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids, quant="fp8_w8a8")
    if scheme == "fp8-tensor":
        w13_scale, w2_scale = w13_scale.view(8, 1, 1), w2_scale.view(8, 1, 1)
    elif scheme == "fp8-channel":
        w13_scale, w2_scale = w13_scale.unsqueeze(-1), w2_scale.unsqueeze(-1)
    hmoe_torch._raw_weights_warned = True
    raw = hmoe_torch.fused_experts(x, w13, w2, topk_weights, topk_ids, **fp8_kwargs(scheme, w13_scale, w2_scale))
    assert torch.equal(raw, expected)
    # Scales given with a PreparedWeights replace its own (w2's scale scales the output linearly).
    again = hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids,
                                     **fp8_kwargs(scheme, w13_scale, w2_scale * 2))
    assert relative_error(again, 2 * expected.double()) < 1e-2


@gpu
@pytest.mark.parametrize("num_tokens", [1, 100])
def test_fp8_tensor_static_activation_scales(num_tokens):
    w13, w13_scale, w2, w2_scale, prepared = fp8_layer("qwen", "fp8-tensor")
    x, logits = make_tokens(num_tokens, 2048, 128, seed=43)
    topk_weights, topk_ids = reference_softmax_topk(logits, 8, renormalize=True)
    # Static scales as a calibration would set them (a little headroom over this batch), then
    # deliberately small ones, which saturate: hmoe must saturate exactly as the reference.
    for a1_scale, a2_scale in ((x.float().abs().amax() / 400, torch.tensor(0.01, device="cuda")),
                               (torch.tensor(1e-3, device="cuda"), torch.tensor(1e-4, device="cuda"))):
        a1_scale, a2_scale = a1_scale.reshape(1).float(), a2_scale.reshape(1).float()
        out = hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids, quant="fp8_w8a8",
                                       a1_scale=a1_scale, a2_scale=a2_scale, out=poisoned_out(x))
        ref = reference_fp8_experts(x, w13, w13_scale, w2, w2_scale, "fp8-tensor", topk_weights, topk_ids, a1_scale,
                                    a2_scale)
        error = relative_error(out, ref)
        print(f"fp8-tensor static a1={a1_scale.item():.3g} a2={a2_scale.item():.3g} T={num_tokens}: "
              f"rel error {error:.2e}")
        assert error <= FP8_TOLERANCE


@gpu
def test_fp8_fused_moe_matches_reference():
    w13, w13_scale, w2, w2_scale, prepared = fp8_layer("qwen", "fp8-block")
    x, logits = make_tokens(100, 2048, 128, seed=44)
    out = hmoe_torch.fused_moe(x, logits, prepared, None, 8, True, quant="fp8_w8a8", out=poisoned_out(x))
    topk_weights, topk_ids = reference_softmax_topk(logits, 8, renormalize=True)
    error = relative_error(out, reference_fp8_experts(x, w13, w13_scale, w2, w2_scale, "fp8-block", topk_weights,
                                                      topk_ids))
    print(f"fused_moe fp8-block: rel error {error:.2e}")
    assert error <= FP8_TOLERANCE


# ---- torch.compile and CUDA graphs -------------------------------------------------------------------

@gpu
def test_custom_op_passes_opcheck(small_layer):
    _, _, prepared = small_layer
    x, logits = make_tokens(16, 256, 8)
    topk_weights, topk_ids = reference_softmax_topk(logits, 2, renormalize=True)
    torch.library.opcheck(torch.ops.hmoe.fused_experts.default,
                          (torch.empty_like(x), x, prepared.w13, prepared.w2, topk_weights, topk_ids, 8, 128, True))
    torch.library.opcheck(torch.ops.hmoe.fused_moe.default,
                          (torch.empty_like(x), x, logits, prepared.w13, prepared.w2, None, 2, True, False, 1, 1, 1.0,
                           8, 128, True))


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_matches_eager(qwen_layer, mode):
    _, _, prepared = qwen_layer
    torch._dynamo.reset()

    # Routing stays outside: inductor may round a softmax differently, the op itself is deterministic.
    def layer(x, topk_weights, topk_ids):
        return hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids.long()) * 2.0

    compiled = torch.compile(layer, fullgraph=True, mode=mode)
    for num_tokens in (1, 64, 64, 257):
        x, logits = make_tokens(num_tokens, 2048, 128, seed=num_tokens)
        topk_weights, topk_ids = reference_softmax_topk(logits, 8, renormalize=True)
        expected = layer(x, topk_weights, topk_ids)
        got = compiled(x, topk_weights, topk_ids).clone()
        assert torch.equal(got, expected), f"T={num_tokens}"

    compiled_moe = torch.compile(lambda x, logits: hmoe_torch.fused_moe(x, logits, prepared, None, 8, True),
                                 fullgraph=True, mode=mode)
    x, logits = make_tokens(32, 2048, 128, seed=11)
    for _ in range(3):
        assert torch.equal(compiled_moe(x, logits).clone(), hmoe_torch.fused_moe(x, logits, prepared, None, 8, True))


@gpu
def test_fp8_custom_op_passes_opcheck():
    _, _, _, _, prepared = fp8_layer("small", "fp8-block")
    x, logits = make_tokens(16, 256, 8)
    topk_weights, topk_ids = reference_softmax_topk(logits, 2, renormalize=True)
    torch.library.opcheck(torch.ops.hmoe.fused_experts.default,
                          (torch.empty_like(x), x, prepared.w13, prepared.w2, topk_weights, topk_ids, 8, 128, True,
                           prepared.w13_scale, prepared.w2_scale, None, None, "fp8-block"))
    _, _, _, _, tensor_layer = fp8_layer("small", "fp8-tensor")
    torch.library.opcheck(torch.ops.hmoe.fused_moe.default,
                          (torch.empty_like(x), x, logits, tensor_layer.w13, tensor_layer.w2, None, 2, True, False, 1,
                           1, 1.0, 8, 128, True, tensor_layer.w13_scale, tensor_layer.w2_scale,
                           torch.full((1,), 0.01, device="cuda"), None, "fp8-tensor"))


@gpu
@pytest.mark.parametrize("scheme", ["fp8-block", "fp8-tensor"])
def test_fp8_torch_compile_matches_eager(scheme):
    """Raw fp8 weights and vLLM-shaped scales traced through the wrapper (scheme inference, scale
    reshapes) into the op; same bits as eager."""
    w13, w13_scale, w2, w2_scale, prepared = fp8_layer("qwen", scheme)
    torch._dynamo.reset()
    a1_scale = torch.full((1,), 0.02, device="cuda") if scheme == "fp8-tensor" else None

    w13_scale_vllm = w13_scale if scheme == "fp8-block" else w13_scale.unsqueeze(-1)  # [E, 1], as vLLM may keep it

    def layer(x, topk_weights, topk_ids):
        return hmoe_torch.fused_experts(x, prepared, None, topk_weights, topk_ids.long(), a1_scale=a1_scale,
                                        **fp8_kwargs(scheme, w13_scale_vllm, w2_scale)) * 2.0

    compiled = torch.compile(layer, fullgraph=True)
    for num_tokens in (1, 64, 257):
        x, logits = make_tokens(num_tokens, 2048, 128, seed=num_tokens)
        topk_weights, topk_ids = reference_softmax_topk(logits, 8, renormalize=True)
        assert torch.equal(compiled(x, topk_weights, topk_ids).clone(), layer(x, topk_weights, topk_ids)), \
            f"T={num_tokens}"


@gpu
@pytest.mark.parametrize("num_tokens", [1, 64, 1000])
def test_fp8_cuda_graph_capture_and_replay(num_tokens):
    w13, w13_scale, w2, w2_scale, prepared = fp8_layer("qwen", "fp8-block")
    x, logits = make_tokens(num_tokens, 2048, 128, seed=50)
    topk_weights, topk_ids = reference_softmax_topk(logits, 8, renormalize=True)
    static_x, static_weights, static_ids = x.clone(), topk_weights.clone(), topk_ids.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        hmoe_torch.fused_experts(static_x, prepared, None, static_weights, static_ids, quant="fp8_w8a8")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = hmoe_torch.fused_experts(static_x, prepared, None, static_weights, static_ids, quant="fp8_w8a8")

    for seed in (51, 52):
        new_x, new_logits = make_tokens(num_tokens, 2048, 128, seed=seed)
        new_weights, new_ids = reference_softmax_topk(new_logits, 8, renormalize=True)
        static_x.copy_(new_x)
        static_weights.copy_(new_weights)
        static_ids.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        eager = hmoe_torch.fused_experts(new_x, prepared, None, new_weights, new_ids, quant="fp8_w8a8")
        assert torch.equal(graph_out, eager)
        error = relative_error(graph_out, reference_fp8_experts(new_x, w13, w13_scale, w2, w2_scale, "fp8-block",
                                                                new_weights, new_ids))
        assert error <= FP8_TOLERANCE


@gpu
@pytest.mark.parametrize("num_tokens", [1, 64, 1000])
def test_cuda_graph_capture_and_replay(qwen_layer, num_tokens):
    w13, w2, prepared = qwen_layer
    x, logits = make_tokens(num_tokens, 2048, 128, seed=20)
    static_x, static_logits = x.clone(), logits.clone()
    topk_weights, topk_ids = reference_softmax_topk(logits, 8, renormalize=True)
    static_weights, static_ids = topk_weights.clone(), topk_ids.clone()

    # Warm up on a side stream (plans the runner), then capture both entry points in one graph.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        hmoe_torch.fused_experts(static_x, prepared, None, static_weights, static_ids)
        hmoe_torch.fused_moe(static_x, static_logits, prepared, None, 8, True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        experts_out = hmoe_torch.fused_experts(static_x, prepared, None, static_weights, static_ids)
        moe_out = hmoe_torch.fused_moe(static_x, static_logits, prepared, None, 8, True)

    for seed in (21, 22):
        new_x, new_logits = make_tokens(num_tokens, 2048, 128, seed=seed)
        new_weights, new_ids = reference_softmax_topk(new_logits, 8, renormalize=True)
        static_x.copy_(new_x)
        static_logits.copy_(new_logits)
        static_weights.copy_(new_weights)
        static_ids.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(experts_out, hmoe_torch.fused_experts(new_x, prepared, None, new_weights, new_ids))
        assert torch.equal(moe_out, hmoe_torch.fused_moe(new_x, new_logits, prepared, None, 8, True))
        error = relative_error(experts_out, reference_experts(new_x, w13, w2, new_weights, new_ids))
        assert error <= TOLERANCE
