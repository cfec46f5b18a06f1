"""Attention with the Triton kernels of ``kernels/triton``: paged split-KV decode and
extend-with-prefix, both reading the NHD pool through the request-to-token table.

Runs on CUDA, or on CPU inside Triton's interpreter when ``TRITON_INTERPRET=1`` was set
before the kernels were imported (tests only: the interpreter is slow). Decode steps can be
captured in CUDA graphs: the per-step metadata (rows, lengths, scratch) then lives in
buffers allocated once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.attention.base import AttentionBackend, AttentionShape
from kernels.attention.forward_context import ForwardContext
from kernels.triton.decode_attention import decode_attention, decode_scratch
from kernels.triton.extend_attention import extend_attention
from kernels.triton.store_kv import store_kv

# Splits per decode sequence. Enough programs to fill a GPU at batch 1 with a few KV heads;
# at large batches the extra merge work is small. Fixed so CUDA graphs can capture it.
NUM_KV_SPLITS = 8


@dataclass
class _ExtendMetadata:
    req_rows: torch.Tensor  # [bs] int64, on the device
    prefix_lens: torch.Tensor  # [bs] int64
    extend_lens: torch.Tensor  # [bs] int64
    extend_starts: torch.Tensor  # [bs] int64: first token of each request in the step
    max_extend_len: int


@dataclass
class _DecodeMetadata:
    req_rows: torch.Tensor  # [bs] int64
    seq_lens: torch.Tensor  # [bs] int32
    part_out: torch.Tensor  # [bs, heads, splits, head_dim] float32 scratch
    part_lse: torch.Tensor  # [bs, heads, splits] float32 scratch


def _to_device(columns: list[list[int]], device: torch.device) -> torch.Tensor:
    """Several per-request int columns in one host-to-device copy, ``[len(columns), bs]``."""
    host = torch.tensor(columns, dtype=torch.int64)
    if host.device == device:
        return host
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)


class TritonBackend(AttentionBackend):
    kv_layout = "NHD"
    supports_cuda_graph = True

    def __init__(self, shape: AttentionShape, device: str | torch.device) -> None:
        self.shape = shape
        self.device = torch.device(device)
        self._graph: _DecodeMetadata | None = None

    # ------------------------------------------------------------------ metadata
    def init_forward_metadata(self, ctx: ForwardContext) -> None:
        device = ctx.req_to_token.device
        if ctx.is_decode:
            cols = _to_device([ctx.req_rows.tolist(), ctx.seq_lens], device)
            part_out, part_lse = decode_scratch(
                ctx.batch_size, self.shape.num_heads, NUM_KV_SPLITS, self.shape.head_dim, device
            )
            ctx.attn_metadata = _DecodeMetadata(cols[0], cols[1].to(torch.int32), part_out, part_lse)
            return
        starts, total = [], 0
        for n in ctx.extend_lens:
            starts.append(total)
            total += n
        cols = _to_device([ctx.req_rows.tolist(), ctx.prefix_lens, ctx.extend_lens, starts], device)
        ctx.attn_metadata = _ExtendMetadata(cols[0], cols[1], cols[2], cols[3], max(ctx.extend_lens, default=0))

    def init_cuda_graph_state(self, max_batch_size: int, device: torch.device) -> None:
        part_out, part_lse = decode_scratch(
            max_batch_size, self.shape.num_heads, NUM_KV_SPLITS, self.shape.head_dim, device
        )
        self._graph = _DecodeMetadata(
            req_rows=torch.zeros(max_batch_size, dtype=torch.int64, device=device),
            seq_lens=torch.ones(max_batch_size, dtype=torch.int32, device=device),
            part_out=part_out,
            part_lse=part_lse,
        )

    def init_forward_metadata_capture(self, ctx: ForwardContext) -> None:
        assert self._graph is not None, "init_cuda_graph_state first"
        g, bs = self._graph, ctx.batch_size
        ctx.attn_metadata = _DecodeMetadata(g.req_rows[:bs], g.seq_lens[:bs], g.part_out[:bs], g.part_lse[:bs])

    def init_forward_metadata_replay(self, ctx: ForwardContext) -> None:
        assert self._graph is not None, "init_cuda_graph_state first"
        bs = ctx.batch_size
        cols = _to_device([ctx.req_rows.tolist(), ctx.seq_lens], self._graph.req_rows.device)
        self._graph.req_rows[:bs].copy_(cols[0])
        self._graph.seq_lens[:bs].copy_(cols[1])
        self.init_forward_metadata_capture(ctx)

    # ------------------------------------------------------------------ attention
    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        k_cache, v_cache = ctx.kv_pool.k[layer_id], ctx.kv_pool.v[layer_id]
        store_kv(k, v, k_cache, v_cache, ctx.out_cache_loc)
        meta: _ExtendMetadata = ctx.attn_metadata
        out = torch.empty_like(q)
        return extend_attention(
            q, k, v, out, k_cache, v_cache, ctx.req_to_token, meta.req_rows, meta.prefix_lens,
            meta.extend_lens, meta.extend_starts, meta.max_extend_len, scale,
        )

    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        k_cache, v_cache = ctx.kv_pool.k[layer_id], ctx.kv_pool.v[layer_id]
        store_kv(k, v, k_cache, v_cache, ctx.out_cache_loc)
        meta: _DecodeMetadata = ctx.attn_metadata
        out = torch.empty_like(q)
        return decode_attention(
            q, k_cache, v_cache, ctx.req_to_token, meta.req_rows, meta.seq_lens, meta.part_out, meta.part_lse,
            out, scale,
        )
