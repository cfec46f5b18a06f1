"""Linear layers on CPU with the weight reordered once into oneDNN's blocked layout.

``F.linear`` on CPU hands a plain row-major weight to the GEMM library, which re-blocks it
for its micro-kernel on every call. A decode step is ~120 small GEMMs whose weights stream
from memory each time, so that per-call reorder is a large share of the step. PyTorch's
oneDNN build can keep a weight pre-blocked (the same ops ``torch.compile`` uses for frozen
CPU models). For the default model's 30 layers in bfloat16 on 2 cores, the GEMMs took
~30% less time at batch 1 and ~25% less at batch 32; ``python -m bench_agent.bench_offline``
shows the decode-step times.

Results equal ``F.linear`` bit for bit in bfloat16; in float32 they differ by the GEMM's
summation order (~1e-6 relative). ``tests/test_cpu_packed_linear.py`` checks both.
"""

from __future__ import annotations

import functools

import torch


class PackedLinearUnavailable(RuntimeError):
    """oneDNN weight packing cannot be used here: a PyTorch build without mkldnn, or a CPU
    oneDNN cannot pack this dtype for."""


@functools.cache
def _ops():  # noqa: ANN202
    if not torch.backends.mkldnn.is_available():
        raise PackedLinearUnavailable("this PyTorch build has no oneDNN (mkldnn) support")
    try:
        return torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError) as err:
        raise PackedLinearUnavailable(f"this PyTorch build lacks oneDNN's packed linear ops: {err}") from err


@functools.cache
def check_packing_available(dtype: torch.dtype) -> None:
    """Raise ``PackedLinearUnavailable`` (with the reason) unless weights of ``dtype`` can be
    packed and used here: oneDNN refuses bfloat16 on CPUs without AVX-512 (BW/VL/DQ) or
    AVX-NE-CONVERT, so a small weight is packed and applied once to find out."""
    reorder, linear = _ops()
    try:
        linear(torch.ones(1, 16, dtype=dtype), reorder(torch.ones(16, 16, dtype=dtype)), None, "none", [], "")
    except RuntimeError as err:
        raise PackedLinearUnavailable(f"oneDNN cannot pack {dtype} weights on this CPU: {err}") from err


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (``[out, in]``, float32 or bfloat16, CPU) reordered for ``packed_linear``.
    The result is an opaque oneDNN tensor; keep it for the life of the layer."""
    if weight.device.type != "cpu" or weight.dim() != 2 or weight.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"pack_weight takes a 2-D float32/bfloat16 CPU tensor, got {weight.dtype} "
                         f"{tuple(weight.shape)} on {weight.device}")
    reorder, _ = _ops()
    return reorder(weight.detach().contiguous())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` packed by ``pack_weight``."""
    if x.dtype != packed.dtype or x.shape[-1] != packed.shape[1]:
        raise ValueError(f"packed_linear: input {x.dtype} {tuple(x.shape)} does not fit the weight "
                         f"{packed.dtype} {tuple(packed.shape)}")
    _, linear = _ops()
    return linear(x, packed, bias, "none", [], "")
