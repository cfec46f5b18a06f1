"""What both packed-weight GEMMs (``linear_bf16.py``, ``linear_f32.py``) share on the Python
side: whether this machine's build has the kernel, how a weight is packed for it, and the
one way it is called (arguments checked before their pointers reach C++, rows flattened, an
empty input width answered without the kernel, a build without the kernel reported)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.cpu.build import CpuKernelsUnavailable, load_kernels


def built_with(entry: str) -> bool:
    """Whether the compiled library here answers 1 from the C entry point ``entry`` (a
    ``*_available`` function); False where the library cannot be built at all."""
    try:
        return bool(getattr(load_kernels(), entry)())
    except CpuKernelsUnavailable:
        return False


def pack_weight_with(name: str, dtype: torch.dtype, entry: Callable[..., None], packed_numel: Callable[[int, int], int],
                     weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (``[out, in]`` of ``dtype``, CPU) packed by the C entry point ``entry``
    (``linear_*_pack``) into a flat tensor of ``packed_numel(out, in)`` elements; ``name``
    prefixes the error message."""
    if weight.dtype != dtype or weight.dim() != 2 or weight.device.type != "cpu":
        kind = str(dtype).removeprefix("torch.")
        raise ValueError(f"{name} takes a 2-D {kind} CPU tensor, got {weight.dtype} {tuple(weight.shape)}")
    weight = weight.detach().contiguous()
    out_features, in_features = weight.shape
    packed = torch.empty(packed_numel(out_features, in_features), dtype=dtype)
    entry(weight.data_ptr(), out_features, in_features, packed.data_ptr())
    return packed


def run_packed_gemm(name: str, dtype: torch.dtype, entry: Callable[..., int], missing: str, x: torch.Tensor,
                    packed: torch.Tensor, packed_numel: int, out_features: int,
                    bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` for ``x`` (``[..., in]``) of ``dtype`` and ``W`` packed in
    ``packed`` (``packed_numel`` elements), by the C entry point ``entry`` (the signature of
    ``linear_bf16`` / ``linear_f32``). ``name`` prefixes error messages; ``missing`` is the
    ``CpuKernelsUnavailable`` message when ``entry`` says this build has no kernel."""
    in_features = x.shape[-1]
    kind = str(dtype).removeprefix("torch.")
    if x.dtype != dtype or packed.dtype != dtype or x.device.type != "cpu" or packed.device.type != "cpu":
        raise ValueError(f"{name} takes {kind} CPU tensors, got {x.dtype} and {packed.dtype}")
    if packed.numel() != packed_numel or not packed.is_contiguous():
        raise ValueError(f"{name}: the packed weight does not fit [{out_features}, {in_features}]")
    if bias is not None and (bias.shape != (out_features,) or bias.dtype != dtype or not bias.is_contiguous()
                             or bias.device.type != "cpu"):
        raise ValueError(f"{name}: bias must be a contiguous {kind} CPU [{out_features}] tensor")
    if in_features == 0:  # an empty sum: the bias, or zeros
        out = torch.zeros(*x.shape[:-1], out_features, dtype=dtype)
        return out if bias is None else out + bias
    rows = x.reshape(-1, in_features)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], out_features, dtype=dtype)
    if rows.shape[0]:
        status = entry(rows.data_ptr(), rows.shape[0], in_features, rows.stride(0), packed.data_ptr(), out_features,
                       0 if bias is None else bias.data_ptr(), out.data_ptr(), out_features, torch.get_num_threads())
        if status:
            raise CpuKernelsUnavailable(missing)
    return out.reshape(*x.shape[:-1], out_features)
