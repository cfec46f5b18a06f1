"""Building blocks shared by model files: norms, rotary embeddings, attention, fused linears."""

from __future__ import annotations

from torch import nn

from kernels.cpu.packed_linear import check_packing_available


def enable_cpu_kernels(model: nn.Module) -> int:
    """Switch every module that has a compiled CPU kernel (``kernels/cpu``: RMSNorm, rotary,
    the MLP's SiLU-and-mul) from its PyTorch ops to that kernel. Returns how many switched."""
    switched = 0
    for module in model.modules():
        if hasattr(type(module), "use_cpu_kernels"):
            module.use_cpu_kernels = True
            switched += 1
    return switched


def pack_linear_weights(model: nn.Module) -> int:
    """Reorder every linear weight (and a tied output head) once into oneDNN's blocked
    layout (``kernels/cpu/packed_linear.py``). Raises ``PackedLinearUnavailable`` when this
    PyTorch build cannot. Returns how many weights were packed."""
    check_packing_available()
    packable = [m for m in model.modules() if hasattr(m, "pack_for_cpu")]
    for module in packable:
        module.pack_for_cpu()
    return len(packable)
