"""The fast CPU backend: decode attention by a compiled kernel that reads K/V in place.

A decode step attends one query token per request to its whole context. Gathering every
context into a padded batch for a matmul (what ``torch_native`` does) copies all K/V of
the batch every layer, and on CPU that copy costs more than the attention itself. The
kernel in ``kernels/cpu/paged_attention.cpp`` instead walks each request's slots in the
pool directly, one task per (request, KV head) spread over torch's threads.

Extend steps (prefill, chunked prefill, a new turn on a cached prefix) have many queries
per request, and there a batched matmul over the gathered keys is faster, so they run the
``torch_native`` code unchanged.

Needs a C++ compiler with OpenMP on first use (``kernels/cpu/build.py``).
"""

from __future__ import annotations

import torch

from kernels.attention.torch_native import TorchNativeBackend
from kernels.cpu.build import load_kernels
from kernels.cpu.paged_attention import PagedBatch, paged_attention
from runtime.forward_context import ForwardContext


class CpuBackend(TorchNativeBackend):
    def __init__(self) -> None:
        load_kernels()  # build now, at startup, not inside the first request's forward

    def init_forward_metadata(self, ctx: ForwardContext) -> None:
        if not ctx.is_decode:
            super().init_forward_metadata(ctx)
            return
        ctx.attn_metadata = PagedBatch.build(ctx.req_to_token, ctx.req_rows, ctx.prefix_lens, ctx.extend_lens)

    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        ctx.kv_pool.write(layer_id, ctx.out_cache_loc, k, v)
        return paged_attention(q.contiguous(), ctx.kv_pool.k[layer_id], ctx.kv_pool.v[layer_id], ctx.attn_metadata, scale)
