"""Python entry points of the float32 GEMM on 4-bit affine weight blocks (``linear_q4.cpp``).

``blocks_of`` finds whether a float32 weight is, along each output row, blocks of 32 values
``d * q + m`` (``q`` in 0..15, ``d`` a float16 value), as a GGUF Q4_1 tensor dequantizes to,
and returns ``(d, m, q)`` when every value is reproduced to the bit; ``pack`` lays such a
weight out for the kernel (``None`` for any other weight: it stays on ``linear_f32``);
``linear`` multiplies. The product is the same bits as ``linear_f32``'s on the float32
weight (the same float32 values, summed in the same order), so a layer may take either
kernel for any product; ``few_rows`` says up to how many rows this one is the faster
(``packed_linear.py`` keeps both forms of such weights).
"""

from __future__ import annotations

import functools

import torch

from kernels.cpu.build import load_kernels
from kernels.cpu.gemm_entry import built_with, run_packed_gemm

BLOCK = 32  # input features per block
COLUMNS = 16  # output columns per panel (linear_q4.cpp)


def available() -> bool:
    """Whether the compiled library here has the kernel (a CPU with AVX2 and FMA)."""
    return built_with("linear_q4_available")


@functools.cache
def few_rows() -> int:
    """Products of up to this many rows run faster here than on ``linear_f32``'s panels
    (measured: ``linear_q4.cpp``), so packed layers take this kernel for them."""
    return int(load_kernels().linear_q4_few_rows())


def blocks_of(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """For a float32 ``[out, in]`` weight whose rows are blocks of 32 values ``d * q + m``
    (float32 arithmetic, ``d`` exactly a float16 value, ``q`` in 0..15): the scales ``d`` and
    offsets ``m`` (float32 ``[out, in / 32]``) and ``q`` (uint8 ``[out, in / 32, 32]``), checked
    to give back every value bit for bit; else None. Each block's offset is its smallest value
    and its scale a fifteenth of its range rounded to float16 (how Q4_1 quantizes)."""
    out_features, in_features = weight.shape
    if weight.dtype != torch.float32 or in_features % BLOCK or weight.numel() == 0:
        return None
    # Other weights fail on their first row already: the load skips checking the whole tensor
    # (~0.6 s for the default model's embedding, the tied output layer).
    if out_features > 1 and _blocks_of(weight[:1]) is None:
        return None
    return _blocks_of(weight)


def _blocks_of(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``blocks_of`` for a weight of the right type and width."""
    out_features, in_features = weight.shape
    if not torch.isfinite(weight).all():
        return None
    blocks = weight.reshape(out_features, in_features // BLOCK, BLOCK)
    m = blocks.amin(-1)
    d = ((blocks.amax(-1) - m) / 15).to(torch.float16).to(torch.float32)
    if not torch.isfinite(d).all():
        return None
    step = torch.where(d > 0, d, torch.ones_like(d)).unsqueeze(-1)
    q = ((blocks - m.unsqueeze(-1)) / step).round().clamp(0, 15)
    again = d.unsqueeze(-1) * q + m.unsqueeze(-1)  # d * q is exact; one rounding, as the kernel's FMA
    if not torch.equal(again.view(torch.int32), blocks.view(torch.int32)):
        return None
    return d, m, q.to(torch.uint8)


@functools.cache
def _packed_bytes(out_features: int, in_features: int) -> int:
    return load_kernels().linear_q4_packed_bytes(out_features, in_features)


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (float32 ``[out, in]``) in the kernel's layout (``linear_q4.cpp``) as a flat
    float32 tensor of its bytes, or None when it is not 4-bit affine blocks (``blocks_of``)."""
    found = blocks_of(weight.detach())
    if found is None:
        return None
    d, m, q = found
    out_features, in_features = weight.shape
    panels = -(-out_features // COLUMNS)
    pad = panels * COLUMNS - out_features  # columns past out_features: d = m = q = 0
    d, m = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (d, m))
    q = torch.nn.functional.pad(q, (0, 0, 0, 0, 0, pad))
    blocks = in_features // BLOCK
    # [panel, block, column] scales and offsets; q as [panel, block, k, column]
    d = d.view(panels, COLUMNS, blocks).transpose(1, 2)
    m = m.view(panels, COLUMNS, blocks).transpose(1, 2)
    q = q.view(panels, COLUMNS, blocks, BLOCK).permute(0, 2, 3, 1)
    nibbles = q[..., : COLUMNS // 2] | (q[..., COLUMNS // 2 :] << 4)  # byte j: column j, j + 8
    packed = torch.cat([d.contiguous().view(torch.uint8).reshape(panels, blocks, -1),
                        m.contiguous().view(torch.uint8).reshape(panels, blocks, -1),
                        nibbles.contiguous().reshape(panels, blocks, -1)], dim=-1)
    assert packed.numel() == _packed_bytes(out_features, in_features)
    return packed.reshape(-1).view(torch.float32)


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for float32 ``x`` (``[..., in]``) and ``W`` packed by ``pack``."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"linear_q4.linear: input width {x.shape[-1]} is not a multiple of {BLOCK}")
    return run_packed_gemm("linear_q4.linear", torch.float32, load_kernels().linear_q4,
                           "this build of the CPU kernels has no 4-bit float32 GEMM (no AVX2 and FMA)", x, packed,
                           _packed_bytes(out_features, x.shape[-1]) // 4, out_features, bias)
