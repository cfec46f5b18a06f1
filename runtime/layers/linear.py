"""Linear layers that know their tensor-parallel slice and load it from full checkpoints."""

from __future__ import annotations

import torch
from torch import nn

from kernels.cpu.packed_linear import PackedWeight, pack_weight, packed_linear
from runtime.distributed import NO_TP, TPInfo


class Linear(nn.Linear):
    """``nn.Linear`` that can switch, after loading, to a weight packed for a fast CPU GEMM
    (``kernels/cpu/packed_linear.py``): ``pack_for_cpu`` packs it and frees the plain copy."""

    packed_weight: PackedWeight | None = None

    def pack_for_cpu(self) -> bool:
        """Pack the weight (once); whether this call packed it."""
        if self.packed_weight is not None:
            return False
        self.packed_weight = pack_weight(self.weight)
        self.weight = None  # type: ignore[assignment]  # only the packed copy is used from now on
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_weight is not None:
            return packed_linear(x, self.packed_weight, self.bias)
        return super().forward(x)


class MergedLinear(Linear):
    """Several projections of the same input stored as one matrix (one GEMM instead of
    several), column-parallel: ``shards`` names each part and its full output width, in
    order; ``parts`` gives this rank's ``(start, count)`` rows of each (default: all).
    Checkpoints that store the parts separately are loaded with ``load_shard``."""

    def __init__(
        self, in_features: int, shards: dict[str, int], bias: bool, parts: dict[str, tuple[int, int]] | None = None
    ) -> None:
        parts = parts or {name: (0, width) for name, width in shards.items()}
        super().__init__(in_features, sum(count for _, count in parts.values()), bias=bias)
        self.full_widths = dict(shards)
        self.parts = parts
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name in shards:
            count = parts[name][1]
            self.shard_offsets[name] = (start, count)
            start += count

    def load_shard(self, shard: str, param_name: str, tensor: torch.Tensor) -> None:
        start, width = self.shard_offsets[shard]
        if tensor.shape[0] != self.full_widths[shard]:
            raise ValueError(f"shard {shard!r}: expected {self.full_widths[shard]} rows, checkpoint has {tensor.shape[0]}")
        first, count = self.parts[shard]
        with torch.no_grad():
            getattr(self, param_name)[start : start + width].copy_(tensor[first : first + count])


class RowParallelLinear(Linear):
    """``y = x W^T`` where this rank holds input columns ``[start, start + count)`` of ``W``:
    each rank multiplies its slice and the all-reduce sums the partial results."""

    def __init__(self, in_features: int, out_features: int, part: tuple[int, int] | None = None, tp: TPInfo = NO_TP) -> None:
        self.part = part or (0, in_features)
        super().__init__(self.part[1], out_features, bias=False)
        self.full_in = in_features
        self.tp = tp

    def load_weight(self, param_name: str, tensor: torch.Tensor) -> None:
        if tuple(tensor.shape) != (self.out_features, self.full_in):
            raise ValueError(f"expected shape {(self.out_features, self.full_in)}, checkpoint has {tuple(tensor.shape)}")
        start, count = self.part
        with torch.no_grad():
            self.weight.copy_(tensor[:, start : start + count])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x))
