"""hmoe.torch against an eager PyTorch reference (float64), eagerly, under torch.compile and under
CUDA-graph capture, with every tensor from PyTorch's allocator. The argument checks that need no
device run wherever PyTorch is installed; the rest needs a Hopper GPU (sm_90a)."""

import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: hmoe.torch is tested where it is")

import hmoe  # noqa: E402
import hmoe.torch as hmoe_torch  # noqa: E402


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


def poisoned_out(x):
    return torch.full_like(x, float("nan"))


# ---- Checks that need no device --------------------------------------------------------------------

class TestArguments:
    def make(self, dtype=torch.bfloat16):
        x = torch.zeros(4, 256, dtype=torch.bfloat16)
        w13 = torch.zeros(8, 256, 256, dtype=dtype)
        w2 = torch.zeros(8, 256, 128, dtype=dtype)
        return x, w13, w2, torch.ones(4, 2), torch.zeros(4, 2, dtype=torch.int32)

    @pytest.mark.parametrize("kwargs", [dict(quant="fp8_w8a8"), dict(quant="fp8_w8a8", block_shape=[128, 128]),
                                        dict(w1_scale=torch.ones(8)), dict(a1_scale=torch.ones(1))])
    def test_fp8_is_not_implemented(self, kwargs):
        with pytest.raises(NotImplementedError, match="hmoe: .*not implemented yet.*bf16"):
            hmoe_torch.fused_experts(*self.make(), **kwargs)

    def test_fp8_weights_are_not_implemented(self):
        with pytest.raises(NotImplementedError, match=r"hmoe: w1 of dtype torch.float8_e4m3fn is not implemented"):
            hmoe_torch.fused_experts(*self.make(torch.float8_e4m3fn))
        with pytest.raises(NotImplementedError):
            hmoe_torch.prepare_weights(*self.make(torch.float8_e4m3fn)[1:3])

    def test_other_activations_are_not_supported(self):
        with pytest.raises(NotImplementedError, match="activation='gelu'"):
            hmoe_torch.fused_experts(*self.make(), activation="gelu")

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
