"""Python entry points of the float32 GEMM for packed weights (``linear_f32.cpp``).

``available()`` says whether this machine's build has it (it needs AVX2 and FMA);
``preferred()`` whether ``pack_weight`` should use it for float32 rather than oneDNN;
``pack`` reorders a weight once; ``linear`` multiplies. Inputs are checked here before
their pointers are passed.
"""

from __future__ import annotations

import functools

import torch

from kernels.cpu.build import load_kernels
from kernels.cpu.gemm_entry import built_with, pack_weight_with, run_packed_gemm


def available() -> bool:
    """Whether the compiled library here has the kernel (a CPU with AVX2 and FMA, and a C++
    compiler to build the library)."""
    return built_with("linear_f32_available")


def preferred() -> bool:
    """Whether float32 weights go to this kernel rather than oneDNN: where it is available
    and the CPU has no AVX-512 (measured faster than oneDNN's packed float32 at every row
    count on AMD Zen 3; on AVX-512 CPUs oneDNN multiplies 16 lanes at a time and keeps
    float32)."""
    return available() and not load_kernels().linear_f32_cpu_has_avx512()


@functools.cache
def _packed_numel(out_features: int, in_features: int) -> int:
    return load_kernels().linear_f32_packed_numel(out_features, in_features)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (float32 ``[out, in]``) in the kernel's panel layout, as a flat float32
    tensor (see ``linear_f32.cpp``)."""
    return pack_weight_with("linear_f32.pack", torch.float32, load_kernels().linear_f32_pack, _packed_numel, weight)


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for float32 ``x`` (``[..., in]``) and ``W`` packed by ``pack``."""
    return run_packed_gemm("linear_f32.linear", torch.float32, load_kernels().linear_f32,
                           "this build of the CPU kernels has no float32 GEMM (no AVX2 and FMA)", x, packed,
                           _packed_numel(out_features, x.shape[-1]), out_features, bias)
