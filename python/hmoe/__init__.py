"""hmoe: fused Mixture-of-Experts layers for NVIDIA Hopper (sm_90a).

The names here are the C++ API over DLPack arrays (any framework; see ``hmoe._ext``). The PyTorch
op that drops into vLLM/SGLang's ``fused_experts`` call is ``hmoe.torch`` (imported on demand, so
``import hmoe`` needs no PyTorch).
"""

import os as _os

# The tuned tables shipped in the wheel are where a runner looks unless $HMOE_TUNED_DIR says
# otherwise (docs/DISPATCH.md); it is read when a Runner is made, so setting it here is enough.
_tuned_dir = _os.path.join(_os.path.dirname(__file__), "tuned")
if not _os.environ.get("HMOE_TUNED_DIR") and _os.path.isdir(_tuned_dir):
    _os.environ["HMOE_TUNED_DIR"] = _tuned_dir

from ._ext import (  # noqa: E402
    CudaError,
    Error,
    InvalidArgumentError,
    Runner,
    Spec,
    compiled_kernels,
    prepare_weights,
    prepared_weight_bytes,
    preset,
    preset_names,
    quantize_weights,
    version,
    weight_scale_count,
    weight_scale_shape,
)

__version__ = version()

__all__ = [
    "CudaError",
    "Error",
    "InvalidArgumentError",
    "Runner",
    "Spec",
    "compiled_kernels",
    "prepare_weights",
    "prepared_weight_bytes",
    "preset",
    "preset_names",
    "quantize_weights",
    "version",
    "weight_scale_count",
    "weight_scale_shape",
]
