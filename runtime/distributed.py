"""Tensor parallelism: which slice of each layer a rank holds, and the one collective the
model needs (an all-reduce after each row-parallel projection).

Heads are split by KV-head groups and MLP columns by ranges, unevenly when the sizes do
not divide (SmolLM2-135M has 3 KV heads: at TP=2 rank 0 holds two groups, rank 1 one).
Each rank's share of a sum is computed locally and the all-reduce adds them up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1
    group: Any = None  # the torch.distributed process group; None when size == 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            torch.distributed.all_reduce(x, group=self.group)
        return x


NO_TP = TPInfo()


def split_range(n: int, size: int, rank: int) -> tuple[int, int]:
    """``(start, count)`` of rank ``rank``'s share of ``n`` items; earlier ranks take the
    remainder."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, base + (1 if rank < extra else 0)


def check_tp_size(tp_size: int, num_kv_heads: int) -> None:
    """``ValueError`` when ``tp_size`` ranks cannot split a model's KV heads: each rank needs one."""
    if tp_size > num_kv_heads:
        raise ValueError(f"tp_size {tp_size} exceeds the model's {num_kv_heads} KV heads (each rank needs one)")


def init_tensor_parallel(rank: int, size: int, init_method: str, device: str) -> TPInfo:
    import datetime

    import torch.distributed as dist

    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=120)
    )
    return TPInfo(rank, size, dist.group.WORLD)


def destroy_tensor_parallel(tp: TPInfo) -> None:
    import torch.distributed as dist

    if tp.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
