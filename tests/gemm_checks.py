"""Checks shared by the GEMM kernels' tests: a product against its float64 value, and skips
where a kernel cannot run on this machine."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from kernels.cpu import gemm_choice, linear_bf16, linear_f32


def gguf_weight(kind: str, out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """A random float32 weight as gguf's own quantizer makes it ``kind`` ("Q4_1", "Q8_0")
    and its dequantizer gives it back."""
    w = np.random.default_rng(seed).standard_normal((out_features, in_features)).astype(np.float32) * 0.05
    quant = gguf.GGMLQuantizationType[kind]
    back = gguf.quants.dequantize(gguf.quants.quantize(w, quant), quant)
    return torch.from_numpy(np.ascontiguousarray(back, dtype=np.float32)).reshape(out_features, in_features)


def close_to_exact(ours: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``ours`` is the exact product (float64) up to one rounding to ``ours.dtype`` and the
    float32 sums' rounding (bounded by in_features * 2^-23 * sum |x_k w_k|)."""
    assert ours.dtype == x.dtype
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    assert ours.shape == exact.shape
    unit = 2.0**-8 if ours.dtype == torch.bfloat16 else 2.0**-24
    sums = (x.double().abs() @ weight.double().abs().T) * x.shape[-1] * 2.0**-23
    bound = exact.abs() * unit + sums + (0 if bias is None else bias.double().abs() * 2.0**-23)
    excess = (ours.double() - exact).abs() - bound
    if excess.numel():
        worst = excess.max().item()
        assert worst <= 0, f"off by {worst:.3g} beyond rounding"


def skip_without_bf16_kernel(kernel: str | None) -> None:
    """Skip unless the bfloat16 GEMM ``kernel`` (a ``gemm_choice.KERNELS`` name; None: no
    kernel of ours) can run here."""
    if kernel is not None and not linear_bf16.available():
        pytest.skip("this CPU has no AVX512-BF16 (or no C++ compiler): no bfloat16 GEMM kernel")
    if kernel == "amx" and not gemm_choice.amx_available():
        pytest.skip("this CPU (or its build or OS) has no AMX tiles: the AMX GEMM cannot run here")


def skip_without_f32_kernel() -> None:
    if not linear_f32.available():
        pytest.skip("this CPU has no AVX2 and FMA (or no C++ compiler): no float32 GEMM kernel")
