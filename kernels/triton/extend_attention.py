"""Extend (prefill) attention: a request's new tokens attend fully to its cached prefix and
causally to each other.

A program owns ``BLOCK_M`` new tokens of one request for one query head and keeps an online
softmax over two passes:

1. the cached prefix, read from the KV pool through the request's row of the
   request-to-token table (its slots are scattered: they come from the radix cache);
2. the new tokens, read from this step's contiguous ``k``/``v`` (no indirection), under the
   causal mask, stopping at the block's last query.

The new K/V are also stored in the pool (by ``store_kv``) for later steps, but reading them
from the step's own tensors saves the gather.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _online_softmax_step(scores, v, m_i, l_i, acc):
    """Fold one block of scores ``[M, N]`` (masked entries at -inf) and values ``[N, D]`` into
    the running max ``m_i``, denominator ``l_i`` and unnormalised output ``acc``."""
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _extend_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    req_to_token_ptr,
    req_rows_ptr,
    prefix_lens_ptr,
    extend_lens_ptr,
    extend_starts_ptr,
    scale,
    stride_q_token,
    stride_q_head,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_o_token,
    stride_o_head,
    stride_cache_slot,
    stride_cache_head,
    stride_table_row,
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    block_m = tl.program_id(2)

    extend_len = tl.load(extend_lens_ptr + req).to(tl.int32)
    first_query = block_m * BLOCK_M
    if first_query >= extend_len:
        return
    kv_head = head // GROUP_SIZE
    row = tl.load(req_rows_ptr + req).to(tl.int64)
    prefix_len = tl.load(prefix_lens_ptr + req).to(tl.int32)
    token0 = tl.load(extend_starts_ptr + req).to(tl.int64)

    offs_m = first_query + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < extend_len
    mask_d = offs_d < HEAD_DIM

    q_offs = (token0 + offs_m)[:, None] * stride_q_token + head * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    q = q.to(k_ptr.dtype.element_ty)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # 1. the cached prefix: every query sees all of it
    for n0 in range(0, prefix_len, BLOCK_N):
        pos = n0 + offs_n
        mask_n = pos < prefix_len
        slots = tl.load(req_to_token_ptr + row * stride_table_row + pos, mask=mask_n, other=0).to(tl.int64)
        kv_offs = slots[:, None] * stride_cache_slot + kv_head * stride_cache_head + offs_d[None, :]
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(k_ptr.dtype.element_ty)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(v_ptr.dtype.element_ty)
        scores = tl.dot(q, tl.trans(k)) * scale
        scores = tl.where(mask_n[None, :], scores, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(scores, v, m_i, l_i, acc)

    # 2. the new tokens, causally; keys past this block's last query are never visible
    new_end = tl.minimum(extend_len, first_query + BLOCK_M)
    for n0 in range(0, new_end, BLOCK_N):
        pos = n0 + offs_n
        mask_n = pos < extend_len
        kv_mask = mask_n[:, None] & mask_d[None, :]
        tokens = (token0 + pos)[:, None]
        k = tl.load(k_ptr + tokens * stride_k_token + kv_head * stride_k_head + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + tokens * stride_v_token + kv_head * stride_v_head + offs_d[None, :], mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale
        visible = (pos[None, :] <= offs_m[:, None]) & mask_n[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(scores, v, m_i, l_i, acc)

    out = acc / l_i[:, None]
    o_offs = (token0 + offs_m)[:, None] * stride_o_token + head * stride_o_head + offs_d[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def extend_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_starts: torch.Tensor,
    max_extend_len: int,
    scale: float,
    block_m: int = 64,
    block_n: int = 64,
) -> torch.Tensor:
    """``q [tokens, heads, dim]``, ``k``/``v [tokens, kv_heads, dim]``: the step's new tokens,
    request ``i`` at ``extend_starts[i] .. + extend_lens[i]``; its prefix of
    ``prefix_lens[i]`` tokens is in the NHD caches at ``req_to_token[req_rows[i]]``.
    Writes and returns ``out`` (shaped like ``q``)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    batch_size = req_rows.shape[0]
    group_size = num_heads // k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1 and k_cache.stride(2) == 1
    if batch_size == 0 or max_extend_len == 0:
        return out
    grid = (batch_size, num_heads, triton.cdiv(max_extend_len, block_m))
    _extend_kernel[grid](
        q,
        k,
        v,
        out,
        k_cache,
        v_cache,
        req_to_token,
        req_rows,
        prefix_lens,
        extend_lens,
        extend_starts,
        scale,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        req_to_token.stride(0),
        GROUP_SIZE=group_size,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4 if head_dim <= 64 else 8,
        num_stages=2,
    )
    return out
