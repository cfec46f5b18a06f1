"""The attention-backend interface.

Rules every backend follows:
  - ``init_forward_metadata(ctx)`` runs once per step, before the first layer, and may
    precompute anything derived from the batch layout (indices, masks, plans); it must not
    read or write K/V.
  - ``forward_extend`` / ``forward_decode`` first store the new tokens' K/V into
    ``ctx.out_cache_loc`` of layer ``layer_id``, then attend: query token ``j`` of request
    ``i`` (absolute position ``prefix_lens[i] + j``) sees every token of the request at
    positions ``<=`` its own, read through ``req_to_token[req_rows[i]]``.
  - Inputs: ``q`` ``[num_tokens, num_heads, head_dim]``, ``k``/``v``
    ``[num_tokens, num_kv_heads, head_dim]``; output ``[num_tokens, num_heads, head_dim]``.
    ``num_heads`` is a multiple of ``num_kv_heads`` (grouped-query attention).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from runtime.forward_context import ForwardContext


class AttentionBackend(ABC):
    kv_layout: str = "NHD"  # the KV pool layout this backend reads (see runtime/kv_pool.py)

    @abstractmethod
    def init_forward_metadata(self, ctx: ForwardContext) -> None: ...

    @abstractmethod
    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor: ...

    @abstractmethod
    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor: ...

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        if ctx.is_decode:
            return self.forward_decode(q, k, v, layer_id, scale, ctx)
        return self.forward_extend(q, k, v, layer_id, scale, ctx)
