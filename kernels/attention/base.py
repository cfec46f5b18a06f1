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

Decode steps may be replayed from CUDA graphs (``runtime/executor/cuda_graph_runner.py``). A backend
that allows it sets ``supports_cuda_graph`` and implements the three graph hooks: its
metadata then lives in buffers allocated once, filled before each replay, so the captured
kernels read the new batch through the same addresses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from kernels.attention.forward_context import ForwardContext


@dataclass(frozen=True)
class AttentionShape:
    """This rank's attention geometry. Fast backends plan their kernels once per step,
    before any layer runs, so they need the head counts up front rather than from ``q``."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads


class AttentionBackend(ABC):
    kv_layout: str = "NHD"  # the KV pool layout this backend reads (see runtime/executor/kv_pool.py)
    supports_cuda_graph: bool = False

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

    # ------------------------------------------------------------------ CUDA graphs
    def init_cuda_graph_state(self, max_batch_size: int, device: torch.device) -> None:
        """Allocate the decode metadata buffers every captured batch size reads from."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def init_forward_metadata_capture(self, ctx: ForwardContext) -> None:
        """Point ``ctx.attn_metadata`` at the graph buffers for a decode batch of
        ``ctx.batch_size`` (a captured size), before capturing it."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def init_forward_metadata_replay(self, ctx: ForwardContext) -> None:
        """Fill the graph buffers with ``ctx``'s (already padded) decode batch, before a
        replay. Runs outside the graph, so it may launch kernels and copy from the host."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")
