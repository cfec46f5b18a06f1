"""Write a step's new K/V into the KV pool at the slots the scheduler chose.

One program per token moves that token's K and V rows (all KV heads) and casts them to the
pool's dtype in the same pass: one launch per layer instead of two indexed assignments.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    loc_ptr,
    stride_k_token,
    stride_v_token,
    stride_cache_slot,
    ROW_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + token).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW_SIZE
    k = tl.load(k_ptr + token * stride_k_token + offs, mask=mask)
    v = tl.load(v_ptr + token * stride_v_token + offs, mask=mask)
    tl.store(k_cache_ptr + slot * stride_cache_slot + offs, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + slot * stride_cache_slot + offs, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """``x`` with each token's ``[heads, dim]`` block contiguous (a split of the fused QKV
    output already is; only its token stride differs)."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor
) -> None:
    """``k``/``v``: ``[tokens, kv_heads, head_dim]``; caches: NHD ``[slots, kv_heads, head_dim]``
    (contiguous); ``loc``: ``[tokens]`` slot of each token."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the KV pool must be contiguous"
    assert k.shape[1:] == k_cache.shape[1:] and v.shape[1:] == v_cache.shape[1:]
    k, v = _rows_contiguous(k), _rows_contiguous(v)
    row_size = k.shape[1] * k.shape[2]
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        loc,
        k.stride(0),
        v.stride(0),
        k_cache.stride(0),
        ROW_SIZE=row_size,
        BLOCK=triton.next_power_of_2(row_size),
        num_warps=4 if row_size >= 1024 else 1,
    )
