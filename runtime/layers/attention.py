from __future__ import annotations

import torch
from torch import nn

from kernels.attention.forward_context import get_forward_context


class RadixAttention(nn.Module):
    """Attention over the paged KV pool. All batch layout comes from the forward context, so
    the model only passes this layer's q/k/v."""

    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        return ctx.attn_backend.forward(q, k, v, self.layer_id, self.scale, ctx)
