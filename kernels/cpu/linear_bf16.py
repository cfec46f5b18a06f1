"""Python entry points of the bfloat16 GEMM for packed weights (``linear_bf16.cpp``).

``available()`` says whether this machine's build has it (it needs AVX512-BF16);
``pack`` reorders a weight once; ``linear`` multiplies. Inputs are checked here before
their pointers are passed.
"""

from __future__ import annotations

import functools

import torch

from kernels.cpu.build import load_kernels
from kernels.cpu.gemm_entry import built_with, pack_weight_with, run_packed_gemm


def available() -> bool:
    """Whether the compiled library here has the kernel (a CPU with AVX512-BF16, and a C++
    compiler to build the library)."""
    return built_with("linear_bf16_available")


@functools.cache
def _packed_numel(out_features: int, in_features: int) -> int:
    """Elements of the packed form (the layout is the same in every build): asked of the
    library once per shape, not on every call."""
    return load_kernels().linear_bf16_packed_bytes(out_features, in_features) // 2


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (bfloat16 ``[out, in]``) in the kernel's panel layout, as a flat bfloat16
    tensor (see ``linear_bf16.cpp``)."""
    return pack_weight_with("linear_bf16.pack", torch.bfloat16, load_kernels().linear_bf16_pack, _packed_numel, weight)


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for bfloat16 ``x`` (``[..., in]``) and ``W`` packed by ``pack``."""
    return run_packed_gemm("linear_bf16.linear", torch.bfloat16, load_kernels().linear_bf16,
                           "this build of the CPU kernels has no bfloat16 GEMM (no AVX512-BF16)", x, packed,
                           _packed_numel(out_features, x.shape[-1]), out_features, bias)
