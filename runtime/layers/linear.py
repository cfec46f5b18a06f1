from __future__ import annotations

import torch
from torch import nn


class MergedLinear(nn.Linear):
    """Several projections of the same input stored as one matrix (one GEMM instead of
    several). ``shards`` names each part and its output width, in order; checkpoints that
    store the parts separately are loaded with ``load_shard``."""

    def __init__(self, in_features: int, shards: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(shards.values()), bias=bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, width in shards.items():
            self.shard_offsets[name] = (start, width)
            start += width

    def load_shard(self, shard: str, param_name: str, tensor: torch.Tensor) -> None:
        start, width = self.shard_offsets[shard]
        target = getattr(self, param_name)
        if tensor.shape[0] != width:
            raise ValueError(f"shard {shard!r}: expected {width} rows, checkpoint has {tensor.shape[0]}")
        with torch.no_grad():
            target[start : start + width].copy_(tensor)
