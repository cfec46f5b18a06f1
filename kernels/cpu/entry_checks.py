"""What every Python entry point of the compiled CPU kernels checks before it passes raw
pointers (``elementwise.py``, ``paged_attention.py``), and the per-dtype kernel lookup."""

from __future__ import annotations

import torch

from kernels.cpu.build import load_kernels

# The storage types the kernels are compiled for, and their entry points' name suffixes.
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


def kernel(name: str, dtype: torch.dtype):  # noqa: ANN201
    """The compiled ``name`` for ``dtype`` (``name_f32`` or ``name_bf16``)."""
    if dtype not in SUFFIX:
        raise ValueError(f"{name}: the CPU kernels take float32 or bfloat16, got {dtype}")
    return getattr(load_kernels(), f"{name}_{SUFFIX[dtype]}")


def check_cpu(*tensors: torch.Tensor) -> None:
    if any(t.device.type != "cpu" for t in tensors):
        raise ValueError("the CPU kernels take CPU tensors only")


def token_stride(t: torch.Tensor, what: str) -> int:
    """Token stride of ``t`` (``[tokens, heads, dim]``, e.g. a view into the fused QKV
    projection) whose heads are packed within a token; ``what`` names it in the error."""
    if t.dim() != 3 or t.stride(2) != 1 or t.stride(1) != t.shape[2]:
        raise ValueError(f"{what} must be [tokens, heads, dim] with each token's heads packed")
    return t.stride(0)
