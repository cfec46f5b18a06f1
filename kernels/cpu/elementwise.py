"""Python entry points of the fused elementwise kernels (``elementwise.cpp``).

Each replaces a chain of small PyTorch ops in ``runtime/layers`` and is checked against it
by ``tests/test_cpu_elementwise.py``. Inputs are checked before their pointers are passed.
"""

from __future__ import annotations

import torch

from kernels.cpu.build import load_kernels
from kernels.cpu.entry_checks import check_cpu, kernel, token_stride


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x**2, -1) + eps))`` over the last dimension. With
    ``residual``, first ``residual += x`` in place (rounded to its dtype, as a PyTorch add
    is) and the norm of that sum instead."""
    check_cpu(x, weight)
    x = x.contiguous()
    hidden = x.shape[-1]
    if weight.shape != (hidden,) or weight.dtype != x.dtype or not weight.is_contiguous():
        raise ValueError(f"rms_norm: weight must be a contiguous [{hidden}] tensor of {x.dtype}")
    if residual is not None:
        check_cpu(residual)
        if residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous():
            raise ValueError(f"rms_norm: residual must be a contiguous {tuple(x.shape)} tensor of {x.dtype}")
    out = torch.empty_like(x)
    kernel("rms_norm", x.dtype)(x.data_ptr(), 0 if residual is None else residual.data_ptr(), weight.data_ptr(),
                                 out.data_ptr(), x.numel() // hidden, hidden, eps, torch.get_num_threads())
    return out


def rotary_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate ``q`` and ``k`` in place ("rotate half" layout); ``cos``/``sin`` are float32
    ``[max_positions, dim]`` tables, ``positions`` int64 ``[tokens]``."""
    check_cpu(q, k, positions, cos, sin)
    tokens, dim = q.shape[0], q.shape[-1]
    q_stride, k_stride = token_stride(q, "rotary: q"), token_stride(k, "rotary: k")
    if k.dtype != q.dtype or k.shape[0] != tokens or k.shape[2] != dim or dim % 2:
        raise ValueError(f"rotary: q {tuple(q.shape)} and k {tuple(k.shape)} do not fit together")
    if positions.dtype != torch.int64 or positions.shape != (tokens,) or not positions.is_contiguous():
        raise ValueError("rotary: positions must be a contiguous int64 [tokens] tensor")
    for table in (cos, sin):
        if table.dtype != torch.float32 or table.dim() != 2 or table.shape[1] != dim or not table.is_contiguous():
            raise ValueError(f"rotary: cos/sin must be contiguous float32 [max_positions, {dim}] tables")
    if cos.shape != sin.shape:
        raise ValueError(f"rotary: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} differ")
    # The kernel checks every position against the tables' rows before touching anything.
    status = kernel("rotary", q.dtype)(q.data_ptr(), k.data_ptr(), positions.data_ptr(), cos.data_ptr(),
                                        sin.data_ptr(), cos.shape[0], tokens, q.shape[1], k.shape[1], dim, q_stride,
                                        k_stride, torch.get_num_threads())
    if status:
        raise ValueError(f"rotary: positions outside the table's {cos.shape[0]} rows")


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up`` is ``[..., 2 * width]`` = gate then up."""
    check_cpu(gate_up)
    gate_up = gate_up.contiguous()
    width = gate_up.shape[-1] // 2
    if gate_up.shape[-1] != 2 * width:
        raise ValueError(f"silu_and_mul: last dimension {gate_up.shape[-1]} is not even")
    out = gate_up.new_empty((*gate_up.shape[:-1], width))
    kernel("silu_and_mul", gate_up.dtype)(gate_up.data_ptr(), out.data_ptr(), out.numel() // max(width, 1), width,
                                           torch.get_num_threads())
    return out


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``torch.argmax(x, dim=-1)`` of a float32 ``[rows, cols]`` tensor (int64 ``[rows]``):
    the first index of each row's maximum, NaN counting as the largest. PyTorch's CPU
    argmax walks a row one element at a time (~1.3 ms for 32 x 49,152 logits on 2 cores);
    this one is vectorized."""
    check_cpu(x)
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax_rows takes a float32 [rows, cols > 0] tensor, got {x.dtype} {tuple(x.shape)}")
    x = x.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.int64)
    load_kernels().argmax_rows_f32(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr(), torch.get_num_threads())
    return out
