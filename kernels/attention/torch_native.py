"""Attention in plain PyTorch: the CPU path and the oracle for the fast backends.

Per step, every request's slot list is padded to the batch's longest sequence (padding reads
the reserved slot 0 and is masked out), so each layer costs one gather and one
``scaled_dot_product_attention`` call for the whole batch rather than one per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.attention.base import AttentionBackend
from runtime.forward_context import ForwardContext


@dataclass
class _Metadata:
    slots: torch.Tensor  # [bs, max_seq] int64, padded with slot 0
    mask: torch.Tensor  # [bs, 1, max_ext, max_seq] bool: query may attend key
    query_index: torch.Tensor  # [bs, max_ext] flat token index of each (request, query), 0 for padding
    query_valid: torch.Tensor  # [bs, max_ext] bool


def _gather(cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """K or V of ``slots`` ([bs, seq]) from an HND cache, as ``[kv_heads, bs, seq, dim]``.

    One ``index_select`` along the slot axis: it copies whole rows and is several times
    faster on CPU than advanced indexing with a 2-D index."""
    bs, seq = slots.shape
    rows = cache.index_select(1, slots.reshape(-1))
    return rows.view(cache.shape[0], bs, seq, cache.shape[2]).to(dtype)


class TorchNativeBackend(AttentionBackend):
    kv_layout = "HND"

    def init_forward_metadata(self, ctx: ForwardContext) -> None:
        device = ctx.req_to_token.device
        prefix = torch.tensor(ctx.prefix_lens, device=device)
        extend = torch.tensor(ctx.extend_lens, device=device)
        seq = prefix + extend
        max_seq, max_ext = int(seq.max()), int(extend.max())

        key_pos = torch.arange(max_seq, device=device)
        slots = ctx.req_to_token[ctx.req_rows.to(device), :max_seq]
        slots = torch.where(key_pos < seq[:, None], slots, 0)

        q_off = torch.arange(max_ext, device=device)
        query_valid = q_off < extend[:, None]
        q_pos = prefix[:, None] + q_off  # absolute position of each query
        mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & query_valid[:, :, None]
        # Padded query rows must still see one key, or softmax over nothing gives NaN.
        mask[:, :, 0] |= ~query_valid
        starts = torch.cumsum(extend, 0) - extend
        query_index = torch.where(query_valid, starts[:, None] + q_off, 0)
        ctx.attn_metadata = _Metadata(slots, mask.unsqueeze(1), query_index, query_valid)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        ctx.kv_pool.write(layer_id, ctx.out_cache_loc, k, v)
        meta: _Metadata = ctx.attn_metadata
        keys = _gather(ctx.kv_pool.k[layer_id], meta.slots, q.dtype)  # [kv_heads, bs, seq, dim]
        values = _gather(ctx.kv_pool.v[layer_id], meta.slots, q.dtype)
        queries = q[meta.query_index]  # [bs, max_ext, heads, dim]
        if queries.shape[1] > _SDPA_MIN_QUERIES:
            out = F.scaled_dot_product_attention(
                queries.transpose(1, 2),
                keys.transpose(0, 1),
                values.transpose(0, 1),
                attn_mask=meta.mask,
                scale=scale,
                enable_gqa=q.shape[1] != k.shape[1],
            ).transpose(1, 2)
        else:
            out = _matmul_attention(queries, keys, values, meta.mask, scale)
        if ctx.is_decode:
            return out.reshape(q.shape)
        return out[meta.query_valid]

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
    # K @ q^T keeps the big gathered operand contiguous on the left: no copy of it.
    scores = torch.matmul(keys, qs.transpose(-1, -2)).transpose(-1, -2).float() * scale
    scores = scores.view(kv_heads, bs, group, ext, seq).masked_fill_(~mask.view(1, bs, 1, ext, seq), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(queries.dtype).view(kv_heads, bs, group * ext, seq)
    out = torch.matmul(probs, values).view(kv_heads, bs, group, ext, dim)
    return out.permute(1, 3, 0, 2, 4).reshape(bs, ext, num_heads, dim)
