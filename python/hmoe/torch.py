"""hmoe.torch: hmoe's MoE layer as PyTorch custom ops with vLLM/SGLang's ``fused_experts`` layouts.

    prepared = hmoe.torch.prepare_weights(w13, w2)      # once per layer: w13 [E, 2I, H], w2 [E, H, I]
    out = hmoe.torch.fused_experts(x, prepared, None, topk_weights, topk_ids)

The ops ``torch.ops.hmoe.fused_experts`` and ``torch.ops.hmoe.fused_moe`` write into a given output,
have fake (meta) implementations, run on the current CUDA stream and allocate nothing on the device
besides PyTorch's caching allocator, so they work under ``torch.compile`` and CUDA-graph capture.
hmoe's prepared weights are a private re-layout of w13 (gate and up rows regrouped for the fused
SwiGLU epilogue): pass the PreparedWeights object as ``w1`` (and ``None`` as ``w2``). Raw w1/w2 still
work but are re-laid out on every call (a copy of every expert's weights), with a warning once.

FP8 layers follow vLLM's ``use_fp8_w8a8``: ``quant="fp8_w8a8"``, float8_e4m3fn weights and their
scales, whose shapes choose the scheme (``block_shape=[128, 128]``: fp8-block; one scale per expert:
fp8-tensor; one per output row: fp8-channel, with per-token activation scales).
"""

import atexit
import contextlib
import warnings
from typing import Optional

import torch

from . import _ext

__all__ = ["PreparedWeights", "prepare_weights", "quantize_weights", "fused_experts", "fused_moe", "clear_cache"]

# Runners are planned for a power-of-two bucket of token counts (the plan of a run depends on its
# own T only; the bucket sizes the workspace), so a server sees a handful of runners per layer shape.
_MIN_TOKEN_BUCKET = 16
_runners: dict = {}

_raw_weights_warned = False

_FP8_SCHEMES = ("fp8-tensor", "fp8-channel", "fp8-block")
_BLOCK = 128  # fp8-block: 128×128 weight blocks, 1×128 activation groups


class PreparedWeights:
    """Expert weights re-laid out for hmoe by :func:`prepare_weights` (opaque uint8 buffers).

    Make it once per layer (e.g. in ``process_weights_after_loading``) and keep it on the module;
    it owns its own copies, so the raw w13/w2 may be freed afterwards. FP8 weights keep their scheme
    and their scales (fp32, in the checkpoint layouts).
    """

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, num_experts: int, hidden: int, intermediate: int,
                 scheme: str = "none", w13_scale: Optional[torch.Tensor] = None,
                 w2_scale: Optional[torch.Tensor] = None):
        self.w13 = w13
        self.w2 = w2
        self.num_experts = num_experts
        self.hidden = hidden
        self.intermediate = intermediate
        self.scheme = scheme
        self.w13_scale = w13_scale
        self.w2_scale = w2_scale

    @property
    def device(self) -> torch.device:
        return self.w13.device

    def __repr__(self) -> str:
        scheme = "" if self.scheme == "none" else f", scheme={self.scheme!r}"
        return (f"PreparedWeights(num_experts={self.num_experts}, hidden={self.hidden}, "
                f"intermediate={self.intermediate}{scheme}, device={self.device})")


def clear_cache() -> None:
    """Drops the cached runners (they are rebuilt on the next call)."""
    _runners.clear()


# NOTE: runners still cached at interpreter exit made nanobind report them as leaked (seen on H200).
atexit.register(clear_cache)


# ---- Helpers ---------------------------------------------------------------------------------------

def _untracked(tensor: torch.Tensor) -> torch.Tensor:
    # NOTE: PyTorch refuses to export a tensor that requires grad through DLPack (nn.Parameter).
    return tensor.detach() if tensor.requires_grad else tensor


def _optional_untracked(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if tensor is None else _untracked(tensor)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    # NOTE: e4m3 values travel as their bytes: DLPack knows float8 only since 1.1, older PyTorch not.
    return tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor


def _on_device(device: torch.device):
    if device.type != "cuda":
        raise ValueError(f"hmoe: tensors are on {device}: expected CUDA tensors")
    if device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def _require_supported(activation, quant) -> None:
    if activation != "silu":
        raise NotImplementedError(f"hmoe: activation={activation!r} is not supported: hmoe fuses SwiGLU "
                                  "(silu(gate) * up) only")
    if quant is not None and quant != "fp8_w8a8":
        raise NotImplementedError(f"hmoe: quant={quant!r} is not supported: hmoe runs bf16 layers (quant=None) and "
                                  "FP8 W8A8 layers (quant='fp8_w8a8')")


def _is_fp8(tensor: torch.Tensor) -> bool:
    return tensor.dtype.is_floating_point and tensor.dtype.itemsize == 1


def _weight_shape(w1: torch.Tensor, w2: torch.Tensor) -> tuple:
    """(E, H, I) of raw weights in vLLM's layouts, with the messages the C++ checks use."""
    if not isinstance(w1, torch.Tensor) or not isinstance(w2, torch.Tensor):
        raise TypeError("hmoe: w1 and w2 must be tensors (w13 [E, 2I, H], w2 [E, H, I]) or w1 a PreparedWeights "
                        f"with w2=None; got {type(w1).__name__} and {type(w2).__name__}")
    if w1.dim() != 3 or w1.shape[1] % 2 != 0:
        raise ValueError(f"hmoe: w1 has shape {list(w1.shape)}: expected [E, 2*I, H] (gate rows, then up rows)")
    num_experts, two_intermediate, hidden = w1.shape
    intermediate = two_intermediate // 2
    if list(w2.shape) != [num_experts, hidden, intermediate]:
        raise ValueError(f"hmoe: w2 has shape {list(w2.shape)}: expected [E={num_experts}, H={hidden}, "
                         f"I={intermediate}] to match w1 {list(w1.shape)}")
    if w2.dtype != w1.dtype:
        raise TypeError(f"hmoe: w2 has dtype {w2.dtype}: expected {w1.dtype} like w1")
    return num_experts, hidden, intermediate


# ---- FP8 arguments: vLLM's conventions read into one of hmoe's schemes -----------------------------

def _scale_shape(scheme: str, num_experts: int, rows: int, cols: int) -> list:
    """The checkpoint layout of one matrix's scales (rows N, columns K), as hmoe's C++ API takes it."""
    if scheme == "fp8-tensor":
        return [num_experts]
    if scheme == "fp8-channel":
        return [num_experts, rows]
    return [num_experts, -(-rows // _BLOCK), -(-cols // _BLOCK)]


def _without_trailing_ones(shape) -> list:
    shape = list(shape)
    while len(shape) > 1 and shape[-1] == 1:
        shape.pop()
    return shape


def _scale_matches(scale: torch.Tensor, scheme: str, expected: list) -> bool:
    if scheme == "fp8-block":
        return list(scale.shape) == expected
    # vLLM keeps per-tensor scales as [E] and per-channel ones as [E, N] or [E, N, 1].
    return _without_trailing_ones(scale.shape) == expected


def _uses_blocks(block_shape) -> bool:
    if block_shape is None:
        return False
    if list(block_shape) != [_BLOCK, _BLOCK]:
        raise NotImplementedError(f"hmoe: block_shape={list(block_shape)} is not supported: hmoe's block scheme "
                                  f"is [{_BLOCK}, {_BLOCK}] (DeepSeek-V3's weight_scale_inv)")
    return True


def _fp8_scheme(num_experts: int, hidden: int, intermediate: int, w1_scale, w2_scale, block_shape) -> str:
    """Which scheme the scales describe, as vLLM reads them; raises naming the argument that does not fit."""
    for name, scale in (("w1_scale", w1_scale), ("w2_scale", w2_scale)):
        if scale is None:
            raise ValueError(f"hmoe: FP8 weights need {name} (their dequantisation scales; the scheme follows from "
                             "the shapes of w1_scale and w2_scale, and block_shape)")
        if not isinstance(scale, torch.Tensor):
            raise TypeError(f"hmoe: {name} must be a tensor, got {type(scale).__name__}")
        if not scale.dtype.is_floating_point:
            raise TypeError(f"hmoe: {name} has dtype {scale.dtype}: expected float32 scales")
    w13_rows = 2 * intermediate
    if _uses_blocks(block_shape):
        scheme = "fp8-block"
    elif w1_scale.numel() == num_experts:
        scheme = "fp8-tensor"
    elif w1_scale.numel() == num_experts * w13_rows:
        scheme = "fp8-channel"
    else:
        raise ValueError(f"hmoe: w1_scale has shape {list(w1_scale.shape)}: expected E={num_experts} values "
                         f"(fp8-tensor: [E]) or E*2I={num_experts * w13_rows} values (fp8-channel: [E, 2I] or "
                         f"[E, 2I, 1]), or block_shape=[{_BLOCK}, {_BLOCK}] with "
                         f"{_scale_shape('fp8-block', num_experts, w13_rows, hidden)}")
    for name, scale, rows, cols in (("w1_scale", w1_scale, w13_rows, hidden),
                                    ("w2_scale", w2_scale, hidden, intermediate)):
        expected = _scale_shape(scheme, num_experts, rows, cols)
        if not _scale_matches(scale, scheme, expected):
            raise ValueError(f"hmoe: {name} has shape {list(scale.shape)}: expected {expected} for {scheme} "
                             f"(E={num_experts}, H={hidden}, I={intermediate})")
    return scheme


def _fp8_weight_scales(num_experts, hidden, intermediate, w1_scale, w2_scale, block_shape, copy=False) -> tuple:
    """(scheme, w13_scale, w2_scale): the scales as fp32 in the exact layouts the extension checks."""
    scheme = _fp8_scheme(num_experts, hidden, intermediate, w1_scale, w2_scale, block_shape)
    w13_scale = w1_scale.to(torch.float32, copy=copy).reshape(
        _scale_shape(scheme, num_experts, 2 * intermediate, hidden)).contiguous()
    w2_scale = w2_scale.to(torch.float32, copy=copy).reshape(
        _scale_shape(scheme, num_experts, hidden, intermediate)).contiguous()
    return scheme, _untracked(w13_scale), _untracked(w2_scale)


def _act_scale(name: str, scale, scheme: str) -> Optional[torch.Tensor]:
    """vLLM's a1_scale / a2_scale: a static per-tensor scale (fp8-tensor only) as [1] fp32, or None."""
    if scale is None:
        return None
    if scheme == "none":
        raise ValueError(f"hmoe: {name} is given with quant=None: FP8 arguments need quant='fp8_w8a8'")
    if scheme != "fp8-tensor":
        raise ValueError(f"hmoe: {name} is a static per-tensor activation scale, but the scales describe {scheme}, "
                         "whose activations are quantised dynamically (per token, or per token and 128 columns): "
                         f"pass {name}=None")
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"hmoe: {name} must be a tensor, got {type(scale).__name__}")
    if scale.numel() != 1 or not scale.dtype.is_floating_point:
        raise ValueError(f"hmoe: {name} has shape {list(scale.shape)} and dtype {scale.dtype}: expected one float "
                         "value (a static per-tensor scale)")
    return _untracked(scale.to(torch.float32).reshape(1))


def _layer_weights(w1, w2, quant, w1_scale, w2_scale, block_shape, copy_scales=False) -> tuple:
    """(w13, w2, E, H, I, prepared, scheme, w13_scale, w2_scale) for the ops, from a PreparedWeights or
    raw tensors, with the FP8 arguments checked against the weights."""
    if isinstance(w1, PreparedWeights):
        if w2 is not None and w2 is not w1:
            raise ValueError("hmoe: w1 is a PreparedWeights (it holds w2 too): pass w2=None")
        weights = w1
        w13, w2, prepared, fp8 = weights.w13, weights.w2, True, weights.scheme != "none"
        num_experts, hidden, intermediate = weights.num_experts, weights.hidden, weights.intermediate
        dtype_text = "fp8 e4m3" if fp8 else "bf16"
    else:
        num_experts, hidden, intermediate = _weight_shape(w1, w2)
        w13, prepared, fp8, dtype_text = w1, False, _is_fp8(w1), str(w1.dtype)
    if quant is None:
        if fp8:
            raise ValueError(f"hmoe: w1 holds {dtype_text} weights: pass quant='fp8_w8a8' (with their scales)")
        for name, value in (("w1_scale", w1_scale), ("w2_scale", w2_scale), ("block_shape", block_shape)):
            if value is not None:
                raise ValueError(f"hmoe: {name} is given with quant=None: FP8 arguments need quant='fp8_w8a8'")
        return w13, w2, num_experts, hidden, intermediate, prepared, "none", None, None
    if not fp8 or (not prepared and w13.dtype != torch.float8_e4m3fn):
        raise TypeError(f"hmoe: quant='fp8_w8a8' needs torch.float8_e4m3fn w1 and w2 (hmoe.torch.quantize_weights "
                        f"makes them): w1 holds {dtype_text} weights")
    if prepared and w1_scale is None and w2_scale is None:
        # The PreparedWeights knows its scheme; a block_shape given anyway must agree with it.
        if block_shape is not None and _uses_blocks(block_shape) and weights.scheme != "fp8-block":
            raise ValueError(f"hmoe: block_shape={list(block_shape)} does not match w1, prepared for "
                             f"{weights.scheme}")
        return w13, w2, num_experts, hidden, intermediate, True, weights.scheme, weights.w13_scale, weights.w2_scale
    scheme, w13_scale, w2_scale = _fp8_weight_scales(num_experts, hidden, intermediate, w1_scale, w2_scale,
                                                     block_shape, copy=copy_scales)
    if prepared and scheme != weights.scheme:
        raise ValueError(f"hmoe: w1_scale and w2_scale describe {scheme}, but w1 was prepared for {weights.scheme}")
    return w13, w2, num_experts, hidden, intermediate, prepared, scheme, w13_scale, w2_scale


def _spec(num_experts, top_k, hidden, intermediate, scheme, **routing):
    weight_dtype = "bf16" if scheme == "none" else "fp8-e4m3"
    return _ext.Spec(num_experts, top_k, hidden, intermediate, weight_dtype=weight_dtype, scheme=scheme, **routing)


def _prepare(w13: torch.Tensor, w2: torch.Tensor, num_experts: int, hidden: int, intermediate: int,
             scheme: str) -> tuple:
    """Runs the C++ weight preparation on the current stream into buffers from PyTorch's allocator."""
    spec = _spec(num_experts, 1, hidden, intermediate, scheme)
    w13_bytes, w2_bytes = _ext.prepared_weight_bytes(spec)
    w13_out = torch.empty(w13_bytes, dtype=torch.uint8, device=w13.device)
    w2_out = torch.empty(w2_bytes, dtype=torch.uint8, device=w13.device)
    stream = torch.cuda.current_stream(w13.device).cuda_stream
    _ext.prepare_weights(spec, _as_bytes(_untracked(w13.contiguous())), _as_bytes(_untracked(w2.contiguous())),
                         w13_out, w2_out, stream)
    return w13_out, w2_out


def prepare_weights(w1: torch.Tensor, w2: torch.Tensor, w1_scale: Optional[torch.Tensor] = None,
                    w2_scale: Optional[torch.Tensor] = None, *, block_shape=None) -> PreparedWeights:
    """Re-lays out w1 = w13 [E, 2I, H] and w2 [E, H, I] (CUDA; vLLM's layouts) for hmoe.

    bf16 weights, or float8_e4m3fn weights with their scales (``w1_scale``/``w2_scale`` and
    ``block_shape`` as in :func:`fused_experts`, which choose the scheme; the result keeps a copy).
    Asynchronous on the current stream. Returns a :class:`PreparedWeights` to pass as ``w1`` of
    :func:`fused_experts` / :func:`fused_moe`; cache it on the layer, it is not cheap (a copy of
    every expert's weights).
    """
    if isinstance(w1, PreparedWeights):
        return w1
    _weight_shape(w1, w2)  # types and shapes, before w1.dtype is read
    quant = "fp8_w8a8" if _is_fp8(w1) else None
    w13, w2, num_experts, hidden, intermediate, _, scheme, w13_scale, w2_scale = _layer_weights(
        w1, w2, quant, w1_scale, w2_scale, block_shape, copy_scales=True)
    with torch.no_grad(), _on_device(w1.device):
        w13_out, w2_out = _prepare(w13, w2, num_experts, hidden, intermediate, scheme)
    return PreparedWeights(w13_out, w2_out, num_experts, hidden, intermediate, scheme, w13_scale, w2_scale)


def quantize_weights(w: torch.Tensor, scheme: str, *, ue8m0_scales: bool = False) -> tuple:
    """Quantises bf16 expert weights [E, N, K] (CUDA; w13 [E, 2I, H] or w2 [E, H, I]) to FP8 on the GPU.

    ``scheme`` is ``"fp8-tensor"`` (one scale per expert), ``"fp8-channel"`` (one per row) or
    ``"fp8-block"`` (one per 128×128 block; N and K multiples of 128). Per group, scale = amax / 448
    (rounded up to a power of two with ``ue8m0_scales``), value = e4m3(w / scale). Returns
    ``(values, scales)``: float8_e4m3fn [E, N, K] and fp32 scales [E], [E, N] or
    [E, N/128, K/128] — the ``w1``/``w1_scale`` (or ``w2``/``w2_scale``) of :func:`fused_experts`.
    Asynchronous on the current stream.
    """
    if scheme not in _FP8_SCHEMES:
        raise ValueError(f"hmoe: scheme={scheme!r}: expected one of 'fp8-tensor', 'fp8-channel', 'fp8-block'")
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"hmoe: w must be a tensor, got {type(w).__name__}")
    if w.dtype != torch.bfloat16:
        raise TypeError(f"hmoe: w has dtype {w.dtype}: expected torch.bfloat16")
    alignment = _BLOCK if scheme == "fp8-block" else 64
    if w.dim() != 3 or w.shape[1] % alignment != 0 or w.shape[2] % alignment != 0:
        raise ValueError(f"hmoe: w has shape {list(w.shape)}: expected [E, N, K] with N and K multiples of "
                         f"{alignment} for {scheme}")
    num_experts, rows, cols = w.shape
    # NOTE: the scale groups of an [E, N, K] stack depend on N and K only, so the stack is described
    # as the w2 of a layer with H = N and I = K: either matrix quantises the same way.
    spec = _spec(num_experts, 1, rows, cols, scheme, ue8m0_scales=ue8m0_scales)
    with torch.no_grad(), _on_device(w.device):
        values = torch.empty(num_experts, rows, cols, dtype=torch.float8_e4m3fn, device=w.device)
        scales = torch.empty(_ext.weight_scale_shape(spec, "w2"), dtype=torch.float32, device=w.device)
        stream = torch.cuda.current_stream(w.device).cuda_stream
        _ext.quantize_weights(spec, "w2", _untracked(w.contiguous()), _as_bytes(values), scales, stream)
    return values, scales


def _runner(spec_key: tuple, num_tokens: int, device_index: int):
    bucket = max(_MIN_TOKEN_BUCKET, 1 << (num_tokens - 1).bit_length())
    key = (spec_key, bucket, device_index)
    runner = _runners.get(key)
    if runner is None:
        (experts, top_k, hidden, intermediate, routing, renormalize, num_groups, topk_groups, scale,
         logits_dtype, scheme) = spec_key
        spec = _spec(experts, top_k, hidden, intermediate, scheme, routing=routing, renormalize=renormalize,
                     num_groups=num_groups, topk_groups=topk_groups, routed_scaling_factor=scale,
                     logits_dtype=logits_dtype)
        runner = _ext.Runner(spec, bucket)
        _runners[key] = runner
    return runner


def _workspace(nbytes: int, device: torch.device, stream: int) -> torch.Tensor:
    # NOTE: a fresh tensor every call (the caching allocator hands back a block in about a
    # microsecond): a workspace cached across calls outlived torch.compile's CUDA-graph warm-up runs,
    # whose allocations come from the graph's private pool, and cudagraph trees refused it ("tensor in
    # the cudagraph pool not tracked as outputs", seen on H200). Fresh per call is also safe under
    # plain stream capture, where the graph's pool provides it.
    del stream
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _prepared_for_run(w13, w2, num_experts, hidden, intermediate, scheme, weights_prepared) -> tuple:
    if weights_prepared:
        return w13, w2
    global _raw_weights_warned
    if not _raw_weights_warned:
        _raw_weights_warned = True
        warnings.warn("hmoe.torch: raw w1/w2 are re-laid out on every call (a copy of every expert's weights); "
                      "call hmoe.torch.prepare_weights(w1, w2) once per layer and pass the result as w1",
                      stacklevel=4)
    return _prepare(w13, w2, num_experts, hidden, intermediate, scheme)


def _scale_kwargs(w13_scale, w2_scale, act_scale, intermediate_act_scale) -> dict:
    return dict(w13_scale=_optional_untracked(w13_scale), w2_scale=_optional_untracked(w2_scale),
                act_scale=_optional_untracked(act_scale),
                intermediate_act_scale=_optional_untracked(intermediate_act_scale))


# ---- The ops: real implementations ------------------------------------------------------------------

def _tokens_and_hidden(hidden_states: torch.Tensor) -> tuple:
    if hidden_states.dim() != 2:
        raise ValueError(f"hmoe: hidden_states has shape {list(hidden_states.shape)}: expected [T, H]")
    return tuple(hidden_states.shape)


def _fused_experts_impl(out, hidden_states, w13, w2, topk_weights, topk_ids, num_experts, intermediate,
                        weights_prepared, w13_scale=None, w2_scale=None, act_scale=None, intermediate_act_scale=None,
                        scheme="none") -> None:
    num_tokens, hidden = _tokens_and_hidden(hidden_states)
    if num_tokens == 0:
        return
    device = hidden_states.device
    with _on_device(device):
        w13, w2 = _prepared_for_run(w13, w2, num_experts, hidden, intermediate, scheme, weights_prepared)
        spec_key = (num_experts, topk_ids.shape[1], hidden, intermediate, "softmax", True, 1, 1, 1.0, "float32",
                    scheme)
        runner = _runner(spec_key, num_tokens, device.index)
        stream = torch.cuda.current_stream(device).cuda_stream
        workspace = _workspace(runner.workspace_bytes, device, stream)
        runner.run_from_topk(_untracked(hidden_states), out, w13, w2, topk_ids, _untracked(topk_weights), workspace,
                             stream, **_scale_kwargs(w13_scale, w2_scale, act_scale, intermediate_act_scale))


def _fused_moe_impl(out, hidden_states, router_logits, w13, w2, correction_bias, top_k, renormalize, grouped,
                    num_groups, topk_groups, routed_scaling_factor, num_experts, intermediate,
                    weights_prepared, w13_scale=None, w2_scale=None, act_scale=None, intermediate_act_scale=None,
                    scheme="none") -> None:
    num_tokens, hidden = _tokens_and_hidden(hidden_states)
    if num_tokens == 0:
        return
    device = hidden_states.device
    with _on_device(device):
        w13, w2 = _prepared_for_run(w13, w2, num_experts, hidden, intermediate, scheme, weights_prepared)
        logits_dtype = "bfloat16" if router_logits.dtype == torch.bfloat16 else "float32"
        spec_key = (num_experts, top_k, hidden, intermediate, "grouped" if grouped else "softmax", renormalize,
                    num_groups, topk_groups, routed_scaling_factor, logits_dtype, scheme)
        runner = _runner(spec_key, num_tokens, device.index)
        stream = torch.cuda.current_stream(device).cuda_stream
        workspace = _workspace(runner.workspace_bytes, device, stream)
        bias = None if correction_bias is None else _untracked(correction_bias)
        runner.run_from_logits(_untracked(hidden_states), out, w13, w2, _untracked(router_logits), workspace, stream,
                               correction_bias=bias,
                               **_scale_kwargs(w13_scale, w2_scale, act_scale, intermediate_act_scale))


# ---- The ops: registration (schema from the annotations, fake implementations for tracing) ----------
# The FP8 arguments come last, with defaults, so bf16 calls keep their positional form.

@torch.library.custom_op("hmoe::fused_experts", mutates_args=("out",))
def _fused_experts_op(out: torch.Tensor, hidden_states: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, intermediate: int,
                      weights_prepared: bool, w13_scale: Optional[torch.Tensor] = None,
                      w2_scale: Optional[torch.Tensor] = None, act_scale: Optional[torch.Tensor] = None,
                      intermediate_act_scale: Optional[torch.Tensor] = None, scheme: str = "none") -> None:
    _fused_experts_impl(out, hidden_states, w13, w2, topk_weights, topk_ids, num_experts, intermediate,
                        weights_prepared, w13_scale, w2_scale, act_scale, intermediate_act_scale, scheme)


@_fused_experts_op.register_fake
def _(out, hidden_states, w13, w2, topk_weights, topk_ids, num_experts, intermediate, weights_prepared,
      w13_scale=None, w2_scale=None, act_scale=None, intermediate_act_scale=None, scheme="none") -> None:
    return None


@torch.library.custom_op("hmoe::fused_moe", mutates_args=("out",))
def _fused_moe_op(out: torch.Tensor, hidden_states: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
                  w2: torch.Tensor, correction_bias: Optional[torch.Tensor], top_k: int, renormalize: bool,
                  grouped: bool, num_groups: int, topk_groups: int, routed_scaling_factor: float, num_experts: int,
                  intermediate: int, weights_prepared: bool, w13_scale: Optional[torch.Tensor] = None,
                  w2_scale: Optional[torch.Tensor] = None, act_scale: Optional[torch.Tensor] = None,
                  intermediate_act_scale: Optional[torch.Tensor] = None, scheme: str = "none") -> None:
    _fused_moe_impl(out, hidden_states, router_logits, w13, w2, correction_bias, top_k, renormalize, grouped,
                    num_groups, topk_groups, routed_scaling_factor, num_experts, intermediate, weights_prepared,
                    w13_scale, w2_scale, act_scale, intermediate_act_scale, scheme)


@_fused_moe_op.register_fake
def _(out, hidden_states, router_logits, w13, w2, correction_bias, top_k, renormalize, grouped, num_groups,
      topk_groups, routed_scaling_factor, num_experts, intermediate, weights_prepared, w13_scale=None, w2_scale=None,
      act_scale=None, intermediate_act_scale=None, scheme="none") -> None:
    return None


# ---- Public entry points --------------------------------------------------------------------------

def fused_experts(hidden_states: torch.Tensor, w1, w2, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                  activation: str = "silu", quant: Optional[str] = None, w1_scale=None, w2_scale=None,
                  a1_scale=None, a2_scale=None, block_shape=None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """vLLM/SGLang's ``fused_experts``: ``out[t] = Σ_j topk_weights[t,j] · W2[e] · (silu(W1[e]·x) ⊙ W3[e]·x)``.

    hidden_states [T, H] bf16; w1 a :class:`PreparedWeights` (w2=None) or raw w13 [E, 2I, H] and
    w2 [E, H, I] (re-laid out on every call: slow); topk_weights [T, k] (fp32; other float dtypes
    are converted); topk_ids [T, k] (int32; int64 is converted). An id outside [0, E) contributes
    nothing. ``out`` [T, H] bf16 is written and returned (it may be hidden_states itself); a new
    tensor when None. Activations other than silu raise NotImplementedError.

    FP8 (vLLM's ``use_fp8_w8a8``): ``quant="fp8_w8a8"``, float8_e4m3fn w1/w2 and fp32 scales
    (a PreparedWeights carries its own). ``block_shape=[128, 128]``: fp8-block, ``w1_scale``
    [E, 2I/128, H/128], activations in dynamic 1×128 groups. Otherwise ``w1_scale`` with E values
    is fp8-tensor (``a1_scale``/``a2_scale``: static per-tensor activation scales, one value each;
    None: dynamic), and with E·2I values ([E, 2I] or [E, 2I, 1]) fp8-channel, with dynamic
    per-token activation scales. ``w2_scale`` follows the same scheme for w2 [E, H, I].
    """
    _require_supported(activation, quant)
    w13, w2, num_experts, _, intermediate, prepared, scheme, w13_scale, w2_scale = _layer_weights(
        w1, w2, quant, w1_scale, w2_scale, block_shape)
    act_scale = _act_scale("a1_scale", a1_scale, scheme)
    intermediate_act_scale = _act_scale("a2_scale", a2_scale, scheme)
    if topk_ids.dtype != torch.int32:
        topk_ids = topk_ids.to(torch.int32)
    if topk_weights.dtype != torch.float32:
        topk_weights = topk_weights.to(torch.float32)
    hidden_states = hidden_states.contiguous()
    if out is None:
        out = torch.empty(hidden_states.shape, dtype=hidden_states.dtype, device=hidden_states.device)
    args = (out, hidden_states, w13, w2, topk_weights.contiguous(), topk_ids.contiguous(), num_experts,
            intermediate, prepared, w13_scale, w2_scale, act_scale, intermediate_act_scale, scheme)
    # NOTE: eager calls skip the dispatcher round trip (tens of µs of host time); traced code
    # records the registered op.
    if torch.compiler.is_compiling():
        torch.ops.hmoe.fused_experts(*args)
    else:
        _fused_experts_impl(*args)
    return out


def fused_moe(hidden_states: torch.Tensor, router_logits: torch.Tensor, w1, w2, top_k: int, renormalize: bool, *,
              use_grouped_topk: bool = False, num_expert_group: Optional[int] = None,
              topk_group: Optional[int] = None, e_score_correction_bias: Optional[torch.Tensor] = None,
              routed_scaling_factor: float = 1.0, quant: Optional[str] = None, w1_scale=None, w2_scale=None,
              a1_scale=None, a2_scale=None, block_shape=None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Routing and experts in one call: hmoe routes ``router_logits`` [T, E] (fp32 or bf16) itself.

    Softmax top-k (``renormalize`` divides the k weights by their sum), or with
    ``use_grouped_topk`` DeepSeek-V3's grouped sigmoid routing: ``num_expert_group`` groups,
    ``topk_group`` kept, ``e_score_correction_bias`` [E] added for the choice, the chosen sigmoid
    scores normalised to sum 1 and scaled by ``routed_scaling_factor``. Weights and the FP8
    arguments as in :func:`fused_experts`.
    """
    _require_supported("silu", quant)
    w13, w2, num_experts, _, intermediate, prepared, scheme, w13_scale, w2_scale = _layer_weights(
        w1, w2, quant, w1_scale, w2_scale, block_shape)
    act_scale = _act_scale("a1_scale", a1_scale, scheme)
    intermediate_act_scale = _act_scale("a2_scale", a2_scale, scheme)
    if use_grouped_topk:
        if num_expert_group is None or topk_group is None:
            raise ValueError("hmoe: use_grouped_topk=True needs num_expert_group and topk_group")
        if not renormalize:
            raise NotImplementedError("hmoe: grouped routing always normalises the chosen scores to sum 1 "
                                      "(DeepSeek-V3); renormalize=False is not supported with use_grouped_topk")
        num_groups, topk_groups = int(num_expert_group), int(topk_group)
    else:
        if e_score_correction_bias is not None or routed_scaling_factor != 1.0:
            raise NotImplementedError("hmoe: e_score_correction_bias and routed_scaling_factor apply to grouped "
                                      "routing (use_grouped_topk=True) only")
        num_groups, topk_groups = 1, 1
    if router_logits.dtype not in (torch.float32, torch.bfloat16):
        router_logits = router_logits.to(torch.float32)
    bias = None
    if e_score_correction_bias is not None:
        bias = e_score_correction_bias.to(torch.float32).contiguous()
    hidden_states = hidden_states.contiguous()
    if out is None:
        out = torch.empty(hidden_states.shape, dtype=hidden_states.dtype, device=hidden_states.device)
    args = (out, hidden_states, router_logits.contiguous(), w13, w2, bias, int(top_k), bool(renormalize),
            bool(use_grouped_topk), num_groups, topk_groups, float(routed_scaling_factor), num_experts, intermediate,
            prepared, w13_scale, w2_scale, act_scale, intermediate_act_scale, scheme)
    if torch.compiler.is_compiling():
        torch.ops.hmoe.fused_moe(*args)
    else:
        _fused_moe_impl(*args)
    return out
