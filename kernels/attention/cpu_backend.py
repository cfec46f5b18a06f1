"""The fast CPU backend: attention by a compiled kernel that reads K/V in place.

Gathering every request's context into a padded batch for a matmul (what ``torch_native``
does) copies all K/V of the batch every layer, and on CPU that copy costs more than the
attention itself. The kernel in ``kernels/cpu/paged_attention.cpp`` instead walks each
request's slots in the pool directly, in tasks spread over torch's threads: one per (query
token, KV head), or in bfloat16 extends one per (block of a request's tokens, KV head) as
small matrix products; a query token only reads the keys it may see (no masked work).

The same kernel serves decode and extend steps (prefill, chunked prefill, a new turn on a
cached prefix). On 2 cores with the default model the per-token tasks alone already took
less attention time than ``torch_native``'s batched matmul / SDPA path on every shape
measured, from one-token decodes to 4,000-token prompts: about half on four 450-token
prompts, 0.6x for 20-token turns on 450-token cached prefixes; the bf16 extend blocks take
~0.6x the time of the per-token tasks again (``python -m bench_agent.bench_offline`` shows
the effect on the prefill rate).

Needs a C++ compiler with OpenMP on first use (``kernels/cpu/build.py``).
"""

from __future__ import annotations

import torch

from kernels.attention.base import AttentionBackend
from kernels.attention.forward_context import ForwardContext
from kernels.cpu.build import load_kernels
from kernels.cpu.paged_attention import PagedBatch, paged_attention, store_kv


class CpuBackend(AttentionBackend):
    kv_layout = "HND"  # the kernel reads one KV head's rows contiguously

    def __init__(self) -> None:
        load_kernels()  # build now, at startup, not inside the first request's forward

    def init_forward_metadata(self, ctx: ForwardContext) -> None:
        ctx.attn_metadata = PagedBatch.build(ctx.req_to_token, ctx.req_rows, ctx.prefix_lens, ctx.extend_lens)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        k_cache, v_cache = ctx.kv_pool.k[layer_id], ctx.kv_pool.v[layer_id]
        store_kv(k_cache, v_cache, ctx.out_cache_loc, k, v)  # KVPool.write's work, in one pass
        return paged_attention(q.contiguous(), k_cache, v_cache, ctx.attn_metadata, scale)

    forward_extend = _attend
    forward_decode = _attend
