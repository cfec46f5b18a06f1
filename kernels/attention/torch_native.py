"""Attention in plain PyTorch: the CPU path and the oracle for the fast backends.

Per step, requests are sorted by length into a few groups; within a group every request's
slot list is padded to the group's longest sequence (padding reads the reserved slot 0 and
is masked out), so each layer costs one gather and one attention call per group rather
than one per request. The KV pool is head-major (``HND``) so a gather is ready for bmm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.attention.base import AttentionBackend
from kernels.attention.decode_kv_buffers import (
    BUDGET_BYTES,
    HEADROOM,
    DecodeKVBuffers,
    buffer_bytes,
)
from runtime.forward_context import ForwardContext


@dataclass
class _Group:
    """Requests of similar length, padded together to the group's longest sequence."""

    slots: torch.Tensor  # [n, max_seq] int64, padded with slot 0
    mask: torch.Tensor  # [n, 1, max_ext, max_seq] bool: query may attend key
    query_index: torch.Tensor  # [n, max_ext] flat token index of each (request, query), 0 for padding
    query_valid: torch.Tensor  # [n, max_ext] bool
    token_index: torch.Tensor  # flat token indices of the group's real queries, in order
    # Gather targets reused by every layer of the step: fresh multi-MB tensors per layer
    # would be new pages each time, and page faults cost more than the copy.
    key_buf: torch.Tensor | None = None
    value_buf: torch.Tensor | None = None
    # decode groups only: each request's row and sequence length, to move on by a token
    rows: torch.Tensor | None = None
    seq: torch.Tensor | None = None

    def advance_decode(self, req_to_token: torch.Tensor) -> None:
        """The next decode step over the same requests: one more key each."""
        assert self.rows is not None and self.seq is not None
        self.seq = self.seq + 1
        new = self.seq - 1
        self.slots[torch.arange(len(new), device=new.device), new] = req_to_token[self.rows, new]
        self.mask = (torch.arange(self.slots.shape[1], device=new.device) < self.seq[:, None]).view(len(new), 1, 1, -1)


# Padding every request to the batch's longest sequence wastes up to half the KV reads in
# a mixed-length batch; sorting by length and padding within a few groups keeps the waste
# small. Each group costs its own calls per layer, so split only as far as needed.
_MAX_GROUPS, _MAX_PADDING = 4, 1.15


def _length_groups(order: torch.Tensor, seq: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Split requests (``order``: sorted by ``seq``) into the fewest contiguous groups whose
    padded size is within ``_MAX_PADDING`` of the real size (at most ``_MAX_GROUPS``)."""
    real = int(seq.sum())
    for k in range(1, min(_MAX_GROUPS, len(order)) + 1):
        groups = torch.tensor_split(order, k)
        padded = sum(len(g) * int(seq[g].max()) for g in groups)
        if padded <= _MAX_PADDING * real:
            break
    return groups


def _build_group(
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix: torch.Tensor,
    extend: torch.Tensor,
    starts: torch.Tensor,
    capacity: int | None = None,
) -> _Group:
    """``capacity``: pad to this many keys instead of the group's longest sequence (decode
    buffers leave room to grow)."""
    device = req_to_token.device
    rows, prefix, extend, starts = (t.to(device) for t in (rows, prefix, extend, starts))
    seq = prefix + extend
    max_seq, max_ext = capacity or int(seq.max()), int(extend.max())
    key_pos = torch.arange(max_seq, device=device)
    slots = torch.where(key_pos < seq[:, None], req_to_token[rows, :max_seq], 0)
    q_off = torch.arange(max_ext, device=device)
    query_valid = q_off < extend[:, None]
    q_pos = prefix[:, None] + q_off  # absolute position of each query
    mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & query_valid[:, :, None]
    mask[:, :, 0] |= ~query_valid  # padded query rows see one key, or softmax gives NaN
    query_index = torch.where(query_valid, starts[:, None] + q_off, 0)
    group = _Group(slots, mask.unsqueeze(1), query_index, query_valid, query_index[query_valid])
    if max_ext == 1 and bool((extend == 1).all()):
        group.rows, group.seq = rows, seq
    return group


def _gather(cache: torch.Tensor, slots: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """K or V of ``slots`` ([bs, seq]) from an HND cache into ``out``, viewed as
    ``[kv_heads, bs, seq, dim]``.

    One ``index_select`` along the slot axis: it copies whole rows and is several times
    faster on CPU than advanced indexing with a 2-D index."""
    bs, seq = slots.shape
    torch.index_select(cache, 1, slots.reshape(-1), out=out)
    return out.view(cache.shape[0], bs, seq, cache.shape[2])


class TorchNativeBackend(AttentionBackend):
    kv_layout = "HND"

    def __init__(self) -> None:
        self.decode_buffers: DecodeKVBuffers | None = None
        self._decode_groups: list[_Group] = []

    def init_forward_metadata(self, ctx: ForwardContext) -> None:
        rows = ctx.req_rows.cpu()
        state = self.decode_buffers
        if ctx.is_decode and state is not None and state.follows(rows.tolist(), ctx.seq_lens):
            state.advance(ctx.seq_lens)
            ctx.attn_metadata = self._decode_groups
            for group in self._decode_groups:
                group.advance_decode(ctx.req_to_token)
            return
        self.decode_buffers = None
        prefix = torch.tensor(ctx.prefix_lens)
        extend = torch.tensor(ctx.extend_lens)
        starts = torch.cumsum(extend, 0) - extend
        seq = prefix + extend
        order = torch.argsort(seq, stable=True)
        split = _length_groups(order, seq)
        caps: list[int | None] = [None] * len(split)
        if ctx.is_decode:
            limit = ctx.req_to_token.shape[1]
            caps = [min(int(seq[idx].max()) + HEADROOM, limit) for idx in split]
        groups = [
            _build_group(ctx.req_to_token, rows[idx], prefix[idx], extend[idx], starts[idx], cap)
            for idx, cap in zip(split, caps, strict=True)
        ]
        ctx.attn_metadata = groups
        if ctx.is_decode:
            pool = ctx.kv_pool
            sizes = [(len(idx), int(cap)) for idx, cap in zip(split, caps, strict=True)]
            kv_heads, dim = pool.k[0].shape[0], pool.k[0].shape[2]
            if buffer_bytes(len(pool.k), sizes, kv_heads, dim, pool.k[0].dtype) <= BUDGET_BYTES:
                self.decode_buffers = DecodeKVBuffers(rows.tolist(), list(ctx.seq_lens), [c for _, c in sizes])
                self._decode_groups = groups

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        ctx.kv_pool.write(layer_id, ctx.out_cache_loc, k, v)
        groups: list[_Group] = ctx.attn_metadata
        out = torch.empty_like(q)
        for i, group in enumerate(groups):
            if ctx.is_decode and self.decode_buffers is not None:
                keys, values = self._held_kv(ctx, layer_id, i, group, k, v)
            else:
                keys, values = self._gathered_kv(ctx, layer_id, group)
            out[group.token_index] = self._attend_group(q, keys.to(q.dtype), values.to(q.dtype), scale, group)
        return out

    def _gathered_kv(self, ctx: ForwardContext, layer_id: int, g: _Group) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's K/V gathered from the pool, ``[kv_heads, n, seq, dim]`` each, into
        buffers shared by every layer of the step."""
        cache_k, cache_v = ctx.kv_pool.k[layer_id], ctx.kv_pool.v[layer_id]
        if g.key_buf is None:
            shape = (cache_k.shape[0], g.slots.numel(), cache_k.shape[2])
            g.key_buf, g.value_buf = cache_k.new_empty(shape), cache_v.new_empty(shape)
        return _gather(cache_k, g.slots, g.key_buf), _gather(cache_v, g.slots, g.value_buf)  # type: ignore[arg-type]

    def _held_kv(
        self, ctx: ForwardContext, layer_id: int, index: int, g: _Group, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's K/V from the decode buffers (see ``decode_kv_buffers.py``): last step's
        copy plus this step's token, or a fresh gather into new buffers."""
        state = self.decode_buffers
        assert state is not None and g.seq is not None
        held = state.get(layer_id, index)
        if held is None:
            cache_k, cache_v = ctx.kv_pool.k[layer_id], ctx.kv_pool.v[layer_id]
            shape = (cache_k.shape[0], g.slots.numel(), cache_k.shape[2])
            keys = _gather(cache_k, g.slots, cache_k.new_empty(shape))
            values = _gather(cache_v, g.slots, cache_v.new_empty(shape))
        else:
            keys, values = held
            reqs, pos = torch.arange(len(g.seq), device=keys.device), g.seq - 1
            keys[:, reqs, pos] = k[g.token_index].transpose(0, 1).to(keys.dtype)
            values[:, reqs, pos] = v[g.token_index].transpose(0, 1).to(values.dtype)
        state.put(layer_id, index, keys, values)
        return keys, values

    def _attend_group(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, g: _Group
    ) -> torch.Tensor:
        """Attention output of the group's real query tokens, ``[len(g.token_index), heads, dim]``;
        ``keys``/``values`` are ``[kv_heads, n, seq, dim]``."""
        queries = q[g.query_index]  # [n, max_ext, heads, dim]
        if queries.shape[1] > _SDPA_MIN_QUERIES:
            out = F.scaled_dot_product_attention(
                queries.transpose(1, 2),
                keys.transpose(0, 1),
                values.transpose(0, 1),
                attn_mask=g.mask,
                scale=scale,
                enable_gqa=queries.shape[2] != keys.shape[0],
            ).transpose(1, 2)
        else:
            out = _matmul_attention(queries, keys, values, g.mask, scale)
        return out[g.query_valid]

    forward_extend = _attend
    forward_decode = _attend


# PyTorch's CPU flash-attention kernel is tuned for long query blocks; for a few queries
# per request (decode, short extends) two batched matmuls are several times faster.
_SDPA_MIN_QUERIES = 32


def _matmul_attention(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """``queries`` [bs, ext, heads, dim]; ``keys``/``values`` [kv_heads, bs, seq, dim];
    ``mask`` [bs, 1, ext, seq]. Returns [bs, ext, heads, dim]."""
    bs, ext, num_heads, dim = queries.shape
    kv_heads, seq = keys.shape[0], keys.shape[2]
    group = num_heads // kv_heads
    # Rows of one matmul: every query head sharing a KV head, for every query position.
    qs = queries.view(bs, ext, kv_heads, group, dim).permute(2, 0, 3, 1, 4).reshape(kv_heads, bs, group * ext, dim)
    scores = torch.matmul(qs, keys.transpose(-1, -2)).float() * scale  # [kv_heads, bs, group*ext, seq]
    scores = scores.view(kv_heads, bs, group, ext, seq).masked_fill_(~mask.view(1, bs, 1, ext, seq), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(queries.dtype).view(kv_heads, bs, group * ext, seq)
    out = torch.matmul(probs, values).view(kv_heads, bs, group, ext, dim)
    return out.permute(1, 3, 0, 2, 4).reshape(bs, ext, num_heads, dim)
