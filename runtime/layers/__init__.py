"""Building blocks shared by model files: norms, rotary embeddings, attention, fused linears."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from kernels.cpu.packed_linear import PackedWeight, check_packing_available


class FusedElementwise(Protocol):
    """The fused kernels a layer can call instead of its chain of PyTorch ops; the modules
    ``kernels.cpu.elementwise`` (compiled C++, CPU tensors) and ``kernels.triton.elementwise``
    (CUDA tensors) both provide them, with the same signatures and rounding."""

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def rotary_(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> None: ...

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...


def enable_fused_elementwise(model: nn.Module, ops: FusedElementwise | None) -> int:
    """Switch every module that has a fused path (RMSNorm, rotary, the MLP's SiLU-and-mul)
    from its PyTorch ops to ``ops`` (None: back to the PyTorch ops). Returns how many
    switched."""
    switched = 0
    for module in model.modules():
        if hasattr(type(module), "fused_ops"):
            module.fused_ops = ops
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


def resident_weight_bytes(model: nn.Module) -> int:
    """Bytes the model's weights take in memory as it serves: its parameters and buffers,
    and every packed form of a linear weight (the packed layers have freed their plain
    copies; a tied output layer's packed copy is held beside the embedding), and where kept
    a weight's quantized blocks too. Each storage counted once."""
    tensors = [*model.parameters(), *model.buffers()]
    for packed in packed_weights(model):
        tensors += [packed.data] + ([packed.few_rows] if packed.few_rows is not None else [])
    sizes: dict[tuple[str, int], int] = {}
    for t in tensors:
        if t.device.type == "meta":
            continue
        try:
            storage = t.untyped_storage()
            sizes[(str(t.device), storage.data_ptr())] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # an opaque layout (oneDNN's packed weights)
            sizes[(str(t.device), id(t))] = t.numel() * t.element_size()
    return sum(sizes.values())
