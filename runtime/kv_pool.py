"""The K/V tensors: one ``[num_slots, kv_heads, head_dim]`` pair per layer, owned by the worker.

Slot ``s`` of every layer holds the K/V of whichever token the scheduler assigned to ``s``.
The pool never decides which slots are used; it only writes and reads the ones it is given.
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        self.num_slots = num_slots
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def write(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer_id][loc] = k.to(self.k[layer_id].dtype)
        self.v[layer_id][loc] = v.to(self.v[layer_id].dtype)
