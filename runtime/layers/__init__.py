"""Building blocks shared by model files: norms, rotary embeddings, attention, fused linears."""

from __future__ import annotations

import torch
from torch import nn

from kernels.cpu.packed_linear import PackedWeight, check_packing_available


def enable_cpu_kernels(model: nn.Module) -> int:
    """Switch every module that has a compiled CPU kernel (``kernels/cpu``: RMSNorm, rotary,
    the MLP's SiLU-and-mul) from its PyTorch ops to that kernel. Returns how many switched."""
    switched = 0
    for module in model.modules():
        if hasattr(type(module), "use_cpu_kernels"):
            module.use_cpu_kernels = True
            switched += 1
    return switched


def pack_linear_weights(model: nn.Module, dtype: torch.dtype) -> int:
    """Pack every linear weight (and a tied output head) of a ``dtype`` model once for the
    fast CPU GEMMs (``kernels/cpu/packed_linear.py``). Raises
    ``PackedLinearUnavailable``, before touching anything, when this PyTorch build or CPU
    cannot. Returns how many weights were packed."""
    check_packing_available(dtype)
    return sum(bool(m.pack_for_cpu()) for m in model.modules() if hasattr(m, "pack_for_cpu"))


def packed_weights(model: nn.Module) -> list[PackedWeight]:
    """Every packed weight of ``model`` (after ``pack_linear_weights``), the tied head's too."""
    found = [getattr(m, "packed_weight", None) for m in model.modules()]
    found.append(getattr(model, "packed_tied_head", None))
    return [p for p in found if p is not None]
