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


class TorchNativeBackend(AttentionBackend):
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
        # [bs, max_seq, kv_heads, dim] -> [bs, kv_heads, max_seq, dim]
        keys = ctx.kv_pool.k[layer_id][meta.slots].transpose(1, 2).to(q.dtype)
        values = ctx.kv_pool.v[layer_id][meta.slots].transpose(1, 2).to(q.dtype)
        queries = q[meta.query_index].transpose(1, 2)  # [bs, heads, max_ext, dim]
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=meta.mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
        out = out.transpose(1, 2)  # [bs, max_ext, heads, dim]
        if ctx.is_decode:
            return out.reshape(q.shape)
        return out[meta.query_valid]

    forward_extend = _attend
    forward_decode = _attend
