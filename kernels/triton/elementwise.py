"""Fused elementwise kernels for CUDA: RMSNorm (with the residual add), rotary embedding and
SiLU-and-mul, each one launch where the PyTorch ops in ``runtime/layers`` take 6 to 18.

A batch-1 decode step of a small model is a thousand tiny launches; these three chains were
most of them (``bench_agent/bench_gpu.py`` writes the profile). The functions have the same
signatures and rounding as ``kernels/cpu/elementwise.py``, so a layer calls whichever module
the worker chose (``runtime.layers.enable_fused_elementwise``). Every value is computed in
float32 and rounded where the PyTorch chain rounds: the residual sum, the normalised row
before the weight, ``silu(gate)`` before the product. Checked against those chains by
``tests/test_triton_elementwise.py`` (Triton's CPU interpreter) and ``tests/gpu``.

No host synchronisation: every function can be captured in a CUDA graph. Rotary positions
are not bounds-checked here (that would need a copy to the host); the scheduler never
exceeds the context length, which the worker keeps within the tables' rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, hidden, stride_x, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * hidden + offs, mask=mask, other=0.0).to(tl.float32)
        x = (x + residual).to(dtype)  # rounded as PyTorch's add is
        tl.store(residual_ptr + row * hidden + offs, x, mask=mask)
        x = x.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / hidden
    normed = (x * tl.rsqrt(mean_square + eps)).to(dtype).to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + offs, (weight * normed).to(dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x**2, -1) + eps))`` over the last dimension. With
    ``residual``, first ``residual += x`` in place (rounded to its dtype) and the norm of
    that sum instead."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.shape != (hidden,) or weight.dtype != x.dtype or not weight.is_contiguous():
        raise ValueError(f"rms_norm: weight must be a contiguous [{hidden}] tensor of {x.dtype}")
    if residual is not None and (
        residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous()
    ):
        raise ValueError(f"rms_norm: residual must be a contiguous {tuple(x.shape)} tensor of {x.dtype}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(rows,)](
            x2, x2 if residual is None else residual, weight, out, hidden, x2.stride(0), eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=_warps(block),
        )  # fmt: skip
    return out


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, positions_ptr, cos_ptr, sin_ptr,
    stride_q_token, stride_q_head, stride_k_token, stride_k_head, stride_table,
    Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    col = tl.arange(0, BLOCK_HALF)
    in_half = col < HALF  # head sizes such as 80 or 96: the block is the next power of two
    # The tables repeat their first half (cat(freqs, freqs)): one half serves both.
    cos = tl.load(cos_ptr + position * stride_table + col, mask=in_half, other=0.0)[None, :]
    sin = tl.load(sin_ptr + position * stride_table + col, mask=in_half, other=0.0)[None, :]
    _rotate_heads(q_ptr + token * stride_q_token, stride_q_head, Q_HEADS, HALF, BLOCK_Q, BLOCK_HALF, cos, sin)
    _rotate_heads(k_ptr + token * stride_k_token, stride_k_head, K_HEADS, HALF, BLOCK_K, BLOCK_HALF, cos, sin)


@triton.jit
def _rotate_heads(
    base, stride_head, HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr, BLOCK_HALF: tl.constexpr,
    cos, sin,
):  # fmt: skip
    head = tl.arange(0, BLOCK)[:, None]
    col = tl.arange(0, BLOCK_HALF)[None, :]
    first = base + head * stride_head + col
    mask = (head < HEADS) & (col < HALF)
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(first, (a * cos - b * sin).to(dtype), mask=mask)
    tl.store(first + HALF, (b * cos + a * sin).to(dtype), mask=mask)


def rotary_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate ``q`` ``[tokens, heads, dim]`` and ``k`` ``[tokens, kv_heads, dim]`` in place
    ("rotate half" layout); ``cos``/``sin`` are float32 ``[max_positions, dim]`` tables and
    ``positions`` ``[tokens]`` integers. A head's ``dim`` must be contiguous; tokens and
    heads may be strided (a split of the fused QKV output)."""
    tokens, dim = q.shape[0], q.shape[-1]
    if q.dim() != 3 or k.dim() != 3 or k.shape[0] != tokens or k.shape[2] != dim or k.dtype != q.dtype:
        raise ValueError(f"rotary: q {tuple(q.shape)} and k {tuple(k.shape)} do not fit together")
    if q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError("rotary: each head's values must be contiguous")
    if dim % 2:
        raise ValueError(f"rotary: head dim {dim} is not even")
    if positions.shape != (tokens,) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError("rotary: positions must be an integer [tokens] tensor")
    for table in (cos, sin):
        if table.dtype != torch.float32 or table.dim() != 2 or table.shape[1] != dim or not table.is_contiguous():
            raise ValueError(f"rotary: cos/sin must be contiguous float32 [max_positions, {dim}] tables")
    if tokens == 0:
        return
    _rotary_kernel[(tokens,)](
        q, k, positions.contiguous(), cos, sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
        Q_HEADS=q.shape[1], K_HEADS=k.shape[1], HALF=dim // 2,
        BLOCK_Q=triton.next_power_of_2(q.shape[1]), BLOCK_K=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(dim // 2),
    )  # fmt: skip


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, width, stride_in, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(gate_up_ptr + row * stride_in + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + width + offs, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # rounded as F.silu's output is
    tl.store(out_ptr + row * width + offs, (silu * up).to(dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up`` is ``[..., 2 * width]`` = gate then up."""
    width = gate_up.shape[-1] // 2
    if gate_up.shape[-1] != 2 * width:
        raise ValueError(f"silu_and_mul: last dimension {gate_up.shape[-1]} is not even")
    rows_in = gate_up.reshape(-1, 2 * width)
    if rows_in.stride(-1) != 1:
        rows_in = rows_in.contiguous()
    out = gate_up.new_empty((*gate_up.shape[:-1], width))
    if rows_in.shape[0] and width:
        block = min(triton.next_power_of_2(width), 1024)
        grid = (rows_in.shape[0], triton.cdiv(width, block))
        _silu_and_mul_kernel[grid](rows_in, out, width, rows_in.stride(0), BLOCK=block, num_warps=_warps(block))
    return out


def _warps(block: int) -> int:
    """Warps for a program over ``block`` values: about 256 values per warp, 1 to 8."""
    return max(1, min(8, block // 256))
