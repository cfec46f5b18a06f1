"""The forward context: everything one model forward needs besides token ids and positions.

The worker builds one per step and installs it with ``forward_context(ctx)``; attention
layers read it with ``get_forward_context()``. Model code therefore stays free of batch
bookkeeping, and nested or leaked contexts are caught.

It lives beside the attention backends, which read it, so that ``kernels`` imports nothing
from ``runtime``: the KV pool is seen through the ``KVCache`` protocol, which
``runtime/executor/kv_pool.py``'s ``KVPool`` fulfils.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend


class KVCache(Protocol):
    """What the attention backends read of the KV pool: per layer, the K and V tensors (in
    the backend's ``kv_layout``), and a write of one step's K/V at given slots."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    layout: str

    def write(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...


@dataclass
class ForwardContext:
    """One step's batch, in the shapes the attention backends want.

    Requests are laid out back to back: request ``i`` contributes ``extend_lens[i]`` new
    tokens (1 in decode) whose KV go to ``out_cache_loc``; it attends to
    ``seq_lens[i] = prefix_lens[i] + extend_lens[i]`` tokens whose slots are in row
    ``req_rows[i]`` of ``req_to_token``.
    """

    is_decode: bool
    req_rows: torch.Tensor  # [bs] int64
    prefix_lens: list[int]
    extend_lens: list[int]
    out_cache_loc: torch.Tensor  # [num_tokens] int64
    req_to_token: torch.Tensor  # [max_requests, max_context_len] int64
    kv_pool: KVCache
    attn_backend: AttentionBackend
    attn_metadata: Any = None
    seq_lens: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.seq_lens = [p + e for p, e in zip(self.prefix_lens, self.extend_lens, strict=True)]

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.numel())


class _Current(threading.local):
    """The forward running on this thread (two engines of one process may run forwards on
    two threads at once)."""

    ctx: ForwardContext | None = None


_current = _Current()


@contextlib.contextmanager
def forward_context(ctx: ForwardContext, init_metadata: bool = True) -> Iterator[ForwardContext]:
    """Install ``ctx`` for one forward. ``init_metadata=False`` is for CUDA-graph capture,
    whose metadata the backend has already pointed at its graph buffers."""
    if _current.ctx is not None:
        raise RuntimeError("forward contexts do not nest: a forward is already running")
    if init_metadata:
        ctx.attn_backend.init_forward_metadata(ctx)
    _current.ctx = ctx
    try:
        yield ctx
    finally:
        _current.ctx = None


def get_forward_context() -> ForwardContext:
    if _current.ctx is None:
        raise RuntimeError("no forward context: model forwards must run inside forward_context()")
    return _current.ctx
