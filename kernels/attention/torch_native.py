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
from kernels.attention.forward_context import ForwardContext


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
    req_to_token: torch.Tensor, rows: torch.Tensor, prefix: torch.Tensor, extend: torch.Tensor, starts: torch.Tensor
) -> _Group:
    device = req_to_token.device
    rows, prefix, extend, starts = (t.to(device) for t in (rows, prefix, extend, starts))
    seq = prefix + extend
    max_seq, max_ext = int(seq.max()), int(extend.max())
    key_pos = torch.arange(max_seq, device=device)
    slots = torch.where(key_pos < seq[:, None], req_to_token[rows, :max_seq], 0)
    q_off = torch.arange(max_ext, device=device)
    query_valid = q_off < extend[:, None]
    q_pos = prefix[:, None] + q_off  # absolute position of each query
    mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & query_valid[:, :, None]
    mask[:, :, 0] |= ~query_valid  # padded query rows see one key, or softmax gives NaN
    query_index = torch.where(query_valid, starts[:, None] + q_off, 0)
    return _Group(slots, mask.unsqueeze(1), query_index, query_valid, query_index[query_valid])


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

    def init_forward_metadata(self, ctx: ForwardContext) -> None:
        prefix = torch.tensor(ctx.prefix_lens)
        extend = torch.tensor(ctx.extend_lens)
        starts = torch.cumsum(extend, 0) - extend
        rows = ctx.req_rows.cpu()
        seq = prefix + extend
        order = torch.argsort(seq, stable=True)
        ctx.attn_metadata = [
            _build_group(ctx.req_to_token, rows[idx], prefix[idx], extend[idx], starts[idx])
            for idx in _length_groups(order, seq)
        ]

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        ctx.kv_pool.write(layer_id, ctx.out_cache_loc, k, v)
        groups: list[_Group] = ctx.attn_metadata
        out = torch.empty_like(q)
        for group in groups:
            out[group.token_index] = self._attend_group(q, layer_id, scale, ctx, group)
        return out

    def _attend_group(self, q: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext, g: _Group) -> torch.Tensor:
        """Attention output of the group's real query tokens, ``[len(g.token_index), heads, dim]``."""
        cache_k, cache_v = ctx.kv_pool.k[layer_id], ctx.kv_pool.v[layer_id]
        if g.key_buf is None:
            shape = (cache_k.shape[0], g.slots.numel(), cache_k.shape[2])
            g.key_buf, g.value_buf = cache_k.new_empty(shape), cache_v.new_empty(shape)
        keys = _gather(cache_k, g.slots, g.key_buf).to(q.dtype)  # [kv_heads, n, seq, dim]
        values = _gather(cache_v, g.slots, g.value_buf).to(q.dtype)  # type: ignore[arg-type]
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
