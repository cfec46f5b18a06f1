"""Rotary position embeddings (the "rotate half" layout HF checkpoints use), with the
config's ``rope_theta`` and the ``linear`` and ``llama3`` scalings."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from runtime.layers import FusedElementwise


def _inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    # On the CPU even inside a meta-device build: arithmetic on meta tensors imports PyTorch's
    # decompositions (~2 s at start-up).
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq
    assert scaling is not None
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise ValueError(f"rope scaling type {kind!r} is not supported (supported: linear, llama3)")


class RotaryEmbedding(nn.Module):
    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None = None
    ) -> None:
        super().__init__()
        self.half = head_dim // 2
        self._spec = (head_dim, max_positions, theta, scaling)
        self.rebuild()

    def rebuild(self, device: str | torch.device | None = None) -> None:
        """(Re)compute the cos/sin tables in float32; needed after building on the meta device."""
        head_dim, max_positions, theta, scaling = self._spec
        inv_freq = _inv_freq(head_dim, theta, scaling)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32, device="cpu"), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().to(device), persistent=False)
        self.register_buffer("sin", emb.sin().to(device), persistent=False)

    fused_ops: FusedElementwise | None = None  # set by runtime.layers.enable_fused_elementwise

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q``: [tokens, heads, dim], ``k``: [tokens, kv_heads, dim]. The fused kernel
        rotates them in place (they are fresh projections); the PyTorch path returns copies."""
        if self.fused_ops is not None:
            self.fused_ops.rotary_(q, k, positions, self.cos, self.sin)
            return q, k
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : self.half], x[..., self.half :]
        rotated = torch.cat((-x2, x1), dim=-1)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)
