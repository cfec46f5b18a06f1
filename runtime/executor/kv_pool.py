"""The K/V tensors, one pair per layer, owned by the worker.

Slot ``s`` of every layer holds the K/V of whichever token the scheduler assigned to ``s``.
The pool never decides which slots are used; it only writes and reads the ones it is given.

Layouts (chosen by the attention backend):
  - ``NHD``: ``[num_slots, kv_heads, head_dim]`` — a token's heads together (FlashInfer's).
  - ``HND``: ``[kv_heads, num_slots, head_dim]`` — each head's tokens together, so a gather
    of a batch's slots is already laid out as ``[kv_heads, tokens, head_dim]`` for a batched
    matmul, with no transpose copy (what the CPU backend wants).
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
        layout: str = "NHD",
    ) -> None:
        if layout not in ("NHD", "HND"):
            raise ValueError(f"KV layout must be NHD or HND, got {layout!r}")
        self.num_slots = num_slots
        self.layout = layout
        shape = (num_slots, num_kv_heads, head_dim) if layout == "NHD" else (num_kv_heads, num_slots, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def write(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` (``[len(loc), kv_heads, head_dim]``) at slots ``loc``."""
        if self.layout == "NHD":
            self.k[layer_id][loc] = k.to(self.k[layer_id].dtype)
            self.v[layer_id][loc] = v.to(self.v[layer_id].dtype)
        else:
            self.k[layer_id][:, loc] = k.transpose(0, 1).to(self.k[layer_id].dtype)
            self.v[layer_id][:, loc] = v.transpose(0, 1).to(self.v[layer_id].dtype)

    def read(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at slots ``loc`` as ``[len(loc), kv_heads, head_dim]`` (for tests and tools)."""
        if self.layout == "NHD":
            return self.k[layer_id][loc], self.v[layer_id][loc]
        return self.k[layer_id][:, loc].transpose(0, 1), self.v[layer_id][:, loc].transpose(0, 1)
