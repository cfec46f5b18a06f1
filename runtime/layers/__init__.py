"""Building blocks shared by model files: norms, rotary embeddings, attention, fused linears."""

from __future__ import annotations

from torch import nn


def enable_cpu_kernels(model: nn.Module) -> int:
    """Switch every module that has a compiled CPU kernel (``kernels/cpu``: RMSNorm, rotary,
    the MLP's SiLU-and-mul) from its PyTorch ops to that kernel. Returns how many switched."""
    switched = 0
    for module in model.modules():
        if hasattr(type(module), "use_cpu_kernels"):
            module.use_cpu_kernels = True
            switched += 1
    return switched
