"""hmoe.torch: hmoe's MoE layer as PyTorch custom ops with vLLM/SGLang's ``fused_experts`` layouts.

    prepared = hmoe.torch.prepare_weights(w13, w2)      # once per layer: w13 [E, 2I, H], w2 [E, H, I]
    out = hmoe.torch.fused_experts(x, prepared, None, topk_weights, topk_ids)

The ops ``torch.ops.hmoe.fused_experts`` and ``torch.ops.hmoe.fused_moe`` write into a given output,
have fake (meta) implementations, run on the current CUDA stream and allocate nothing on the device
besides PyTorch's caching allocator, so they work under ``torch.compile`` and CUDA-graph capture.
hmoe's prepared weights are a private re-layout of w13 (gate and up rows regrouped for the fused
SwiGLU epilogue): pass the PreparedWeights object as ``w1`` (and ``None`` as ``w2``). Raw w1/w2 still
work but are re-laid out on every call (a copy of every expert's weights), with a warning once.
"""

import contextlib
import warnings
from typing import Optional

import torch

from . import _ext

__all__ = ["PreparedWeights", "prepare_weights", "fused_experts", "fused_moe", "clear_cache"]

# Runners are planned for a power-of-two bucket of token counts (the plan of a run depends on its
# own T only; the bucket sizes the workspace), so a server sees a handful of runners per layer shape.
_MIN_TOKEN_BUCKET = 16
_runners: dict = {}
# Eager runs on one device and stream reuse one workspace; a run being captured into a CUDA graph
# takes its workspace from the graph's private pool, so a replay never shares memory with eager runs.
_workspaces: dict = {}
_raw_weights_warned = False


class PreparedWeights:
    """Expert weights re-laid out for hmoe by :func:`prepare_weights` (opaque uint8 buffers).

    Make it once per layer (e.g. in ``process_weights_after_loading``) and keep it on the module;
    it owns its own copies, so the raw w13/w2 may be freed afterwards.
    """

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, num_experts: int, hidden: int, intermediate: int):
        self.w13 = w13
        self.w2 = w2
        self.num_experts = num_experts
        self.hidden = hidden
        self.intermediate = intermediate

    @property
    def device(self) -> torch.device:
        return self.w13.device

    def __repr__(self) -> str:
        return (f"PreparedWeights(num_experts={self.num_experts}, hidden={self.hidden}, "
                f"intermediate={self.intermediate}, device={self.device})")


def clear_cache() -> None:
    """Drops the cached runners and eager workspaces (they are rebuilt on the next call)."""
    _runners.clear()
    _workspaces.clear()


# ---- Helpers ---------------------------------------------------------------------------------------

def _untracked(tensor: torch.Tensor) -> torch.Tensor:
    # NOTE: PyTorch refuses to export a tensor that requires grad through DLPack (nn.Parameter).
    return tensor.detach() if tensor.requires_grad else tensor


def _on_device(device: torch.device):
    if device.type != "cuda":
        raise ValueError(f"hmoe: tensors are on {device}: expected CUDA tensors")
    if device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def _require_supported(activation, quant, block_shape, scales, w1) -> None:
    if activation != "silu":
        raise NotImplementedError(f"hmoe: activation={activation!r} is not supported: hmoe fuses SwiGLU "
                                  "(silu(gate) * up) only")
    fp8_weights = isinstance(w1, torch.Tensor) and w1.dtype.is_floating_point and w1.dtype.itemsize == 1
    scaled = False
    for scale in scales:  # NOTE: a plain loop, which torch.compile traces without a graph break
        scaled = scaled or scale is not None
    if quant is not None or block_shape is not None or fp8_weights or scaled:
        what = f"quant={quant!r}" if quant is not None else (
            f"w1 of dtype {w1.dtype}" if fp8_weights else "FP8 scales or block_shape")
        raise NotImplementedError(f"hmoe: {what} is not implemented yet: hmoe's kernels run bf16 weights and "
                                  "activations only (FP8 schemes are planned; use quant=None with bf16 w1/w2)")


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
    return num_experts, hidden, intermediate


def _prepare(w13: torch.Tensor, w2: torch.Tensor, num_experts: int, hidden: int, intermediate: int) -> tuple:
    """Runs the C++ weight preparation on the current stream into buffers from PyTorch's allocator."""
    spec = _ext.Spec(num_experts, 1, hidden, intermediate)
    w13_bytes, w2_bytes = _ext.prepared_weight_bytes(spec)
    w13_out = torch.empty(w13_bytes, dtype=torch.uint8, device=w13.device)
    w2_out = torch.empty(w2_bytes, dtype=torch.uint8, device=w13.device)
    stream = torch.cuda.current_stream(w13.device).cuda_stream
    _ext.prepare_weights(spec, _untracked(w13.contiguous()), _untracked(w2.contiguous()), w13_out, w2_out, stream)
    return w13_out, w2_out


def prepare_weights(w1: torch.Tensor, w2: torch.Tensor) -> PreparedWeights:
    """Re-lays out w1 = w13 [E, 2I, H] and w2 [E, H, I] (bf16, CUDA; vLLM's layouts) for hmoe.

    Asynchronous on the current stream. Returns a :class:`PreparedWeights` to pass as ``w1`` of
    :func:`fused_experts` / :func:`fused_moe`; cache it on the layer, it is not cheap (a copy of
    every expert's weights).
    """
    if isinstance(w1, PreparedWeights):
        return w1
    _require_supported("silu", None, None, (), w1)
    num_experts, hidden, intermediate = _weight_shape(w1, w2)
    with torch.no_grad(), _on_device(w1.device):
        w13_out, w2_out = _prepare(w1, w2, num_experts, hidden, intermediate)
    return PreparedWeights(w13_out, w2_out, num_experts, hidden, intermediate)


def _expert_weights(w1, w2) -> tuple:
    """(w13, w2, E, I, prepared) for the ops, from a PreparedWeights or raw tensors."""
    if isinstance(w1, PreparedWeights):
        if w2 is not None and w2 is not w1:
            raise ValueError("hmoe: w1 is a PreparedWeights (it holds w2 too): pass w2=None")
        return w1.w13, w1.w2, w1.num_experts, w1.intermediate, True
    num_experts, _, intermediate = _weight_shape(w1, w2)
    return w1, w2, num_experts, intermediate, False


def _runner(spec_key: tuple, num_tokens: int, device_index: int):
    bucket = max(_MIN_TOKEN_BUCKET, 1 << (num_tokens - 1).bit_length())
    key = (spec_key, bucket, device_index)
    runner = _runners.get(key)
    if runner is None:
        (experts, top_k, hidden, intermediate, routing, renormalize, num_groups, topk_groups, scale,
         logits_dtype) = spec_key
        spec = _ext.Spec(experts, top_k, hidden, intermediate, routing=routing, renormalize=renormalize,
                         num_groups=num_groups, topk_groups=topk_groups, routed_scaling_factor=scale,
                         logits_dtype=logits_dtype)
        runner = _ext.Runner(spec, bucket)
        _runners[key] = runner
    return runner


def _workspace(nbytes: int, device: torch.device, stream: int) -> torch.Tensor:
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    # NOTE: a workspace replaced here goes back to the caching allocator, which hands a block
    # out again only to work on the stream that used it: no run can overwrite another's workspace.
    cached = _workspaces.get(device.index)
    if cached is not None and cached[0] == stream and cached[1].numel() >= nbytes:
        return cached[1]
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
    _workspaces[device.index] = (stream, workspace)
    return workspace


def _prepared_for_run(w13, w2, num_experts, hidden, intermediate, weights_prepared) -> tuple:
    if weights_prepared:
        return w13, w2
    global _raw_weights_warned
    if not _raw_weights_warned:
        _raw_weights_warned = True
        warnings.warn("hmoe.torch: raw w1/w2 are re-laid out on every call (a copy of every expert's weights); "
                      "call hmoe.torch.prepare_weights(w1, w2) once per layer and pass the result as w1",
                      stacklevel=4)
    return _prepare(w13, w2, num_experts, hidden, intermediate)


# ---- The ops: real implementations ------------------------------------------------------------------

def _tokens_and_hidden(hidden_states: torch.Tensor) -> tuple:
    if hidden_states.dim() != 2:
        raise ValueError(f"hmoe: hidden_states has shape {list(hidden_states.shape)}: expected [T, H]")
    return tuple(hidden_states.shape)


def _fused_experts_impl(out, hidden_states, w13, w2, topk_weights, topk_ids, num_experts, intermediate,
                        weights_prepared) -> None:
    num_tokens, hidden = _tokens_and_hidden(hidden_states)
    if num_tokens == 0:
        return
    device = hidden_states.device
    with _on_device(device):
        w13, w2 = _prepared_for_run(w13, w2, num_experts, hidden, intermediate, weights_prepared)
        spec_key = (num_experts, topk_ids.shape[1], hidden, intermediate, "softmax", True, 1, 1, 1.0, "float32")
        runner = _runner(spec_key, num_tokens, device.index)
        stream = torch.cuda.current_stream(device).cuda_stream
        workspace = _workspace(runner.workspace_bytes, device, stream)
        runner.run_from_topk(_untracked(hidden_states), out, w13, w2, topk_ids, _untracked(topk_weights), workspace,
                             stream)


def _fused_moe_impl(out, hidden_states, router_logits, w13, w2, correction_bias, top_k, renormalize, grouped,
                    num_groups, topk_groups, routed_scaling_factor, num_experts, intermediate,
                    weights_prepared) -> None:
    num_tokens, hidden = _tokens_and_hidden(hidden_states)
    if num_tokens == 0:
        return
    device = hidden_states.device
    with _on_device(device):
        w13, w2 = _prepared_for_run(w13, w2, num_experts, hidden, intermediate, weights_prepared)
        logits_dtype = "bfloat16" if router_logits.dtype == torch.bfloat16 else "float32"
        spec_key = (num_experts, top_k, hidden, intermediate, "grouped" if grouped else "softmax", renormalize,
                    num_groups, topk_groups, routed_scaling_factor, logits_dtype)
        runner = _runner(spec_key, num_tokens, device.index)
        stream = torch.cuda.current_stream(device).cuda_stream
        workspace = _workspace(runner.workspace_bytes, device, stream)
        bias = None if correction_bias is None else _untracked(correction_bias)
        runner.run_from_logits(_untracked(hidden_states), out, w13, w2, _untracked(router_logits), workspace, stream,
                               correction_bias=bias)


# ---- The ops: registration (schema from the annotations, fake implementations for tracing) ----------

@torch.library.custom_op("hmoe::fused_experts", mutates_args=("out",))
def _fused_experts_op(out: torch.Tensor, hidden_states: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, intermediate: int,
                      weights_prepared: bool) -> None:
    _fused_experts_impl(out, hidden_states, w13, w2, topk_weights, topk_ids, num_experts, intermediate,
                        weights_prepared)


@_fused_experts_op.register_fake
def _(out, hidden_states, w13, w2, topk_weights, topk_ids, num_experts, intermediate, weights_prepared) -> None:
    return None


@torch.library.custom_op("hmoe::fused_moe", mutates_args=("out",))
def _fused_moe_op(out: torch.Tensor, hidden_states: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
                  w2: torch.Tensor, correction_bias: Optional[torch.Tensor], top_k: int, renormalize: bool,
                  grouped: bool, num_groups: int, topk_groups: int, routed_scaling_factor: float, num_experts: int,
                  intermediate: int, weights_prepared: bool) -> None:
    _fused_moe_impl(out, hidden_states, router_logits, w13, w2, correction_bias, top_k, renormalize, grouped,
                    num_groups, topk_groups, routed_scaling_factor, num_experts, intermediate, weights_prepared)


@_fused_moe_op.register_fake
def _(out, hidden_states, router_logits, w13, w2, correction_bias, top_k, renormalize, grouped, num_groups,
      topk_groups, routed_scaling_factor, num_experts, intermediate, weights_prepared) -> None:
    return None


# ---- Public entry points --------------------------------------------------------------------------

def fused_experts(hidden_states: torch.Tensor, w1, w2, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                  activation: str = "silu", quant: Optional[str] = None, w1_scale=None, w2_scale=None,
                  a1_scale=None, a2_scale=None, block_shape=None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """vLLM/SGLang's ``fused_experts``: ``out[t] = Σ_j topk_weights[t,j] · W2[e] · (silu(W1[e]·x) ⊙ W3[e]·x)``.

    hidden_states [T, H] bf16; w1 a :class:`PreparedWeights` (w2=None) or raw w13 [E, 2I, H] and
    w2 [E, H, I] bf16 (re-laid out on every call: slow); topk_weights [T, k] (fp32; other float
    dtypes are converted); topk_ids [T, k] (int32; int64 is converted). An id outside [0, E)
    contributes nothing. ``out`` [T, H] bf16 is written and returned (it may be hidden_states
    itself); a new tensor when None. FP8 (``quant``, scales, ``block_shape``) and activations other
    than silu raise NotImplementedError.
    """
    _require_supported(activation, quant, block_shape, (w1_scale, w2_scale, a1_scale, a2_scale), w1)
    w13, w2, num_experts, intermediate, prepared = _expert_weights(w1, w2)
    if topk_ids.dtype != torch.int32:
        topk_ids = topk_ids.to(torch.int32)
    if topk_weights.dtype != torch.float32:
        topk_weights = topk_weights.to(torch.float32)
    hidden_states = hidden_states.contiguous()
    if out is None:
        out = torch.empty(hidden_states.shape, dtype=hidden_states.dtype, device=hidden_states.device)
    args = (out, hidden_states, w13, w2, topk_weights.contiguous(), topk_ids.contiguous(), num_experts,
            intermediate, prepared)
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
              routed_scaling_factor: float = 1.0, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Routing and experts in one call: hmoe routes ``router_logits`` [T, E] (fp32 or bf16) itself.

    Softmax top-k (``renormalize`` divides the k weights by their sum), or with
    ``use_grouped_topk`` DeepSeek-V3's grouped sigmoid routing: ``num_expert_group`` groups,
    ``topk_group`` kept, ``e_score_correction_bias`` [E] added for the choice, the chosen sigmoid
    scores normalised to sum 1 and scaled by ``routed_scaling_factor``. Weights as in
    :func:`fused_experts`.
    """
    w13, w2, num_experts, intermediate, prepared = _expert_weights(w1, w2)
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
            prepared)
    if torch.compiler.is_compiling():
        torch.ops.hmoe.fused_moe(*args)
    else:
        _fused_moe_impl(*args)
    return out
