"""Flatten request-to-token rows into CSR indices (FlashInfer's ``kv_indptr``/``kv_indices``
with page size 1), on the device.

Request ``i`` contributes ``req_to_token[req_rows[i], :kv_lens[i]]`` at
``kv_indices[kv_indptr[i] : kv_indptr[i + 1]]``. One program per request copies its row in
blocks, so building the indices costs one launch whatever the batch, and no slot list ever
travels from the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_indices_kernel(
    req_to_token_ptr,
    req_rows_ptr,
    kv_lens_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    stride_table_row,
    BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    row = tl.load(req_rows_ptr + req).to(tl.int64)
    kv_len = tl.load(kv_lens_ptr + req).to(tl.int32)
    out_start = tl.load(kv_indptr_ptr + req).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    for n0 in range(0, kv_len, BLOCK):
        pos = n0 + offs
        mask = pos < kv_len
        slots = tl.load(req_to_token_ptr + row * stride_table_row + pos, mask=mask)
        tl.store(kv_indices_ptr + out_start + pos, slots.to(kv_indices_ptr.dtype.element_ty), mask=mask)


def build_kv_indices(
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    kv_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> torch.Tensor:
    """Fill ``kv_indices`` (at least ``kv_indptr[-1]`` long; int32 for FlashInfer) from the
    table; ``req_rows``, ``kv_lens`` and ``kv_indptr`` live on the table's device."""
    batch_size = req_rows.shape[0]
    if batch_size:
        _kv_indices_kernel[(batch_size,)](
            req_to_token, req_rows, kv_lens, kv_indptr, kv_indices, req_to_token.stride(0), BLOCK=512
        )
    return kv_indices
