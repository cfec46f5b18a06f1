"""Python entry points of the bfloat16 GEMM for packed weights (``linear_bf16.cpp``).

``available()`` says whether this machine's build has it (it needs AVX512-BF16);
``pack`` reorders a weight once; ``linear`` multiplies. Inputs are checked here before
their pointers are passed.
"""

from __future__ import annotations

import functools

import torch

from kernels.cpu.build import CpuKernelsUnavailable, load_kernels


def available() -> bool:
    """Whether the compiled library here has the kernel (a CPU with AVX512-BF16, and a C++
    compiler to build the library)."""
    try:
        return bool(load_kernels().linear_bf16_available())
    except CpuKernelsUnavailable:
        return False


@functools.cache
def _packed_numel(out_features: int, in_features: int) -> int:
    """Elements of the packed form (the layout is the same in every build): asked of the
    library once per shape, not on every call."""
    return load_kernels().linear_bf16_packed_bytes(out_features, in_features) // 2


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (bfloat16 ``[out, in]``) in the kernel's panel layout, as a flat bfloat16
    tensor (see ``linear_bf16.cpp``)."""
    if weight.dtype != torch.bfloat16 or weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"linear_bf16.pack takes a 2-D bfloat16 CPU tensor, got {weight.dtype} {tuple(weight.shape)}")
    weight = weight.detach().contiguous()
    out_features, in_features = weight.shape
    lib = load_kernels()
    packed = torch.empty(_packed_numel(out_features, in_features), dtype=torch.bfloat16)
    lib.linear_bf16_pack(weight.data_ptr(), out_features, in_features, packed.data_ptr())
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for bfloat16 ``x`` (``[..., in]``) and ``W`` packed by ``pack``."""
    in_features = x.shape[-1]
    lib = load_kernels()
    if x.dtype != torch.bfloat16 or packed.dtype != torch.bfloat16 or x.device.type != "cpu" or packed.device.type != "cpu":
        raise ValueError(f"linear_bf16.linear takes bfloat16 CPU tensors, got {x.dtype} and {packed.dtype}")
    if packed.numel() != _packed_numel(out_features, in_features) or not packed.is_contiguous():
        raise ValueError(f"linear_bf16.linear: the packed weight does not fit [{out_features}, {in_features}]")
    if bias is not None and (bias.shape != (out_features,) or bias.dtype != torch.bfloat16 or not bias.is_contiguous()
                             or bias.device.type != "cpu"):
        raise ValueError(f"linear_bf16.linear: bias must be a contiguous bfloat16 CPU [{out_features}] tensor")
    if in_features == 0:  # an empty sum: the bias, or zeros
        out = torch.zeros(*x.shape[:-1], out_features, dtype=torch.bfloat16)
        return out if bias is None else out + bias
    rows = x.reshape(-1, in_features)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], out_features, dtype=torch.bfloat16)
    if rows.shape[0]:
        status = lib.linear_bf16(rows.data_ptr(), rows.shape[0], in_features, rows.stride(0), packed.data_ptr(),
                                 out_features, 0 if bias is None else bias.data_ptr(), out.data_ptr(), out_features,
                                 torch.get_num_threads())
        if status:
            raise CpuKernelsUnavailable("this build of the CPU kernels has no bfloat16 GEMM (no AVX512-BF16)")
    return out.reshape(*x.shape[:-1], out_features)
