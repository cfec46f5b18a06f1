"""Reference attention: per request, gather its K/V through the request-to-token table and
call ``scaled_dot_product_attention``. The CPU path and the oracle for the fast backends."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.attention.base import AttentionBackend
from runtime.forward_context import ForwardContext


@dataclass
class _Metadata:
    slots: list[torch.Tensor]  # per request: the slots of its whole sequence
    masks: list[torch.Tensor | None]  # per request: [extend_len, seq_len] bool, None in decode
    token_offsets: list[int]  # per request: where its query tokens start in the flat batch


class TorchNativeBackend(AttentionBackend):
    def init_forward_metadata(self, ctx: ForwardContext) -> None:
        rows = ctx.req_rows.tolist()
        slots, masks, offsets, start = [], [], [], 0
        for row, prefix_len, extend_len in zip(rows, ctx.prefix_lens, ctx.extend_lens, strict=True):
            seq_len = prefix_len + extend_len
            slots.append(ctx.req_to_token[row, :seq_len])
            if ctx.is_decode:
                masks.append(None)
            else:
                # query j sits at absolute position prefix_len + j and sees keys 0..prefix_len+j
                q_pos = torch.arange(prefix_len, seq_len).unsqueeze(1)
                masks.append(torch.arange(seq_len).unsqueeze(0) <= q_pos)
            offsets.append(start)
            start += extend_len
        ctx.attn_metadata = _Metadata(slots, masks, offsets)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        ctx.kv_pool.write(layer_id, ctx.out_cache_loc, k, v)
        meta: _Metadata = ctx.attn_metadata
        k_cache, v_cache = ctx.kv_pool.k[layer_id], ctx.kv_pool.v[layer_id]
        out = torch.empty_like(q)
        for i, extend_len in enumerate(ctx.extend_lens):
            s = meta.token_offsets[i]
            qi = q[s : s + extend_len].transpose(0, 1)  # [heads, ext, dim]
            ki = k_cache[meta.slots[i]].transpose(0, 1).to(q.dtype)  # [kv_heads, seq, dim]
            vi = v_cache[meta.slots[i]].transpose(0, 1).to(q.dtype)
            oi = F.scaled_dot_product_attention(
                qi, ki, vi, attn_mask=meta.masks[i], scale=scale, enable_gqa=qi.shape[0] != ki.shape[0]
            )
            out[s : s + extend_len] = oi.transpose(0, 1)
        return out

    forward_extend = _attend
    forward_decode = _attend
