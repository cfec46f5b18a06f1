"""Paged decode attention: one query token per request against its whole sequence, read
through the request-to-token table.

Decode is bound by reading K/V, and a batch of a few long sequences gives too few programs
to keep the GPU busy, so the sequence is split (split-KV, flash-decoding):

- stage 1: a program per (request, KV head, split) walks its slice of the sequence and
  writes a partial output, normalised within the slice, and the slice's log-sum-exp. It
  handles every query head of its KV-head group at once, so each K/V row is loaded once
  per group rather than once per query head (grouped-query attention);
- stage 2: a program per (request, query head) merges the splits, weighting each partial
  output by ``exp(lse_split - lse_total)``.

Splits of a short sequence may be empty; they report ``lse = -inf`` and weigh nothing.
The number of splits is fixed per backend so CUDA graphs can capture the launch; the
split length follows each request's length at run time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    req_to_token_ptr,
    req_rows_ptr,
    seq_lens_ptr,
    part_out_ptr,
    part_lse_ptr,
    scale,
    stride_q_token,
    stride_q_head,
    stride_cache_slot,
    stride_cache_head,
    stride_table_row,
    stride_po_req,
    stride_po_head,
    stride_po_split,
    stride_pl_req,
    stride_pl_head,
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    row = tl.load(req_rows_ptr + req).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    split_len = tl.cdiv(seq_len, NUM_SPLITS)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_h = offs_h < GROUP_SIZE
    mask_d = offs_d < HEAD_DIM
    heads = kv_head * GROUP_SIZE + offs_h

    q_offs = req.to(tl.int64) * stride_q_token + heads[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    q = q.to(k_cache_ptr.dtype.element_ty)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        mask_n = pos < end
        slots = tl.load(req_to_token_ptr + row * stride_table_row + pos, mask=mask_n, other=0).to(tl.int64)
        kv_offs = slots[:, None] * stride_cache_slot + kv_head * stride_cache_head + offs_d[None, :]
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale  # [BLOCK_H, BLOCK_N]
        scores = tl.where(mask_n[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    po_offs = req.to(tl.int64) * stride_po_req + heads[:, None] * stride_po_head + split * stride_po_split
    tl.store(part_out_ptr + po_offs + offs_d[None, :], out, mask=mask_h[:, None] & mask_d[None, :])
    pl_offs = req.to(tl.int64) * stride_pl_req + heads * stride_pl_head + split
    tl.store(part_lse_ptr + pl_offs, lse, mask=mask_h)


@triton.jit
def _decode_merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_po_req,
    stride_po_head,
    stride_po_split,
    stride_pl_req,
    stride_pl_head,
    stride_o_token,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    mask_d = offs_d < HEAD_DIM

    lse = tl.load(part_lse_ptr + req * stride_pl_req + head * stride_pl_head + offs_s, mask=mask_s, other=float("-inf"))
    lse_max = tl.max(lse, 0)  # finite: a non-empty sequence has a non-empty first split
    weights = tl.exp(lse - lse_max)
    weights = weights / tl.sum(weights, 0)
    po_offs = req * stride_po_req + head * stride_po_head + offs_s[:, None] * stride_po_split + offs_d[None, :]
    parts = tl.load(part_out_ptr + po_offs, mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    out = tl.sum(parts * weights[:, None], 0)
    tl.store(out_ptr + req * stride_o_token + head * stride_o_head + offs_d, out.to(out_ptr.dtype.element_ty), mask=mask_d)


def decode_scratch(batch_size: int, num_heads: int, num_splits: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Buffers for the partial results: ``part_out [bs, heads, splits, head_dim]`` and
    ``part_lse [bs, heads, splits]``, float32."""
    part_out = torch.empty(batch_size, num_heads, num_splits, head_dim, dtype=torch.float32, device=device)
    part_lse = torch.empty(batch_size, num_heads, num_splits, dtype=torch.float32, device=device)
    return part_out, part_lse


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    block_n: int = 64,
) -> torch.Tensor:
    """Attention of ``q [bs, heads, head_dim]`` (one token per request) over each request's
    ``seq_lens[i]`` tokens, whose slots are ``req_to_token[req_rows[i], :seq_lens[i]]``.
    Caches are NHD ``[slots, kv_heads, head_dim]``. ``part_out``/``part_lse`` come from
    :func:`decode_scratch` (at least ``bs`` rows; their split count sets the split);
    writes and returns ``out`` (shaped like ``q``)."""
    batch_size, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    num_splits = part_lse.shape[2]
    group_size = num_heads // num_kv_heads
    assert k_cache.stride(2) == 1 and q.stride(2) == 1 and out.stride(2) == 1
    block_d = triton.next_power_of_2(head_dim)
    # tl.dot wants every side >= 16; rows past the group are masked
    block_h = max(16, triton.next_power_of_2(group_size))
    _decode_split_kernel[(batch_size, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        req_to_token,
        req_rows,
        seq_lens,
        part_out,
        part_lse,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        req_to_token.stride(0),
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        GROUP_SIZE=group_size,
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        num_warps=4,
        num_stages=2,
    )
    _decode_merge_kernel[(batch_size, num_heads)](
        part_out,
        part_lse,
        out,
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits,
        BLOCK_D=block_d,
        BLOCK_S=triton.next_power_of_2(num_splits),
        num_warps=4 if head_dim >= 128 else 2,
    )
    return out
