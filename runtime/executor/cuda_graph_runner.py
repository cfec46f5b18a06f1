"""CUDA graphs for decode steps.

A decode step of a small model is dozens of tiny kernels per layer; launching them from
Python costs more than running them. The runner captures the whole model forward once per
batch size and replays it: a step then costs one graph launch plus copying its inputs into
the graph's buffers.

- Sizes captured: 1, 2, 4, 8, then every 8 up to 64, then every 16, up to ``max_bs``
  (always included). A batch is padded up to the nearest captured size.
- Padding entries are dummy requests: token 0 at position 0, writing their K/V to the
  reserved slot 0 and attending to one token through the dummy row of the device table.
  Their outputs are dropped.
- Capture runs each size once eagerly first (Triton compiles, FlashInfer plans, cuBLAS
  picks kernels), then records it; sizes share one memory pool, largest first, so the
  smaller graphs reuse its blocks.
- Used only on CUDA, with a backend that supports it, at TP=1, and without
  ``--disable-cuda-graph``; every other step runs eagerly.

The size ladder and the padding are plain functions so they are tested on CPU.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
from torch import nn

from kernels.attention.base import AttentionBackend
from kernels.attention.forward_context import ForwardContext, forward_context
from runtime.executor.device_req_to_token import DeviceReqToToken
from runtime.executor.kv_pool import KVPool


def capture_batch_sizes(max_bs: int) -> list[int]:
    """Batch sizes to capture, ascending: 1, 2, 4, 8, 16, ..., 64 (steps of 8), 80, 96, ...
    (steps of 16), cut at ``max_bs``, which is always the last."""
    if max_bs < 1:
        raise ValueError(f"max_bs must be at least 1, got {max_bs}")
    ladder = [1, 2, 4, *range(8, 65, 8), *range(80, max_bs + 1, 16)]
    sizes = [s for s in ladder if s < max_bs]
    return [*sizes, max_bs]


def padded_batch_size(batch_size: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds ``batch_size``; None when it exceeds them all."""
    i = bisect.bisect_left(sizes, batch_size)
    return sizes[i] if i < len(sizes) else None


@dataclass
class PaddedDecodeBatch:
    """A decode batch grown to a captured size with dummy requests at the end."""

    req_rows: torch.Tensor  # [padded] int64, host
    prefix_lens: list[int]  # tokens already cached; the dummy requests have none
    out_cache_loc: torch.Tensor  # [padded] int64
    input_ids: torch.Tensor  # [padded] int64
    positions: torch.Tensor  # [padded] int64


def pad_decode_batch(
    req_rows: torch.Tensor,
    prefix_lens: list[int],
    out_cache_loc: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    padded_size: int,
    dummy_row: int,
) -> PaddedDecodeBatch:
    """Append ``padded_size - bs`` dummy requests: row ``dummy_row``, no prefix (so they
    attend to their own token only), slot 0, token 0, position 0."""
    pad = padded_size - len(prefix_lens)
    if pad < 0:
        raise ValueError(f"batch of {len(prefix_lens)} does not fit a graph of {padded_size}")

    def grow(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.cat([t.cpu().to(torch.int64), torch.full((pad,), fill, dtype=torch.int64)])

    return PaddedDecodeBatch(
        req_rows=grow(req_rows, dummy_row),
        prefix_lens=[*prefix_lens, *([0] * pad)],
        out_cache_loc=grow(out_cache_loc, 0),
        input_ids=grow(input_ids, 0),
        positions=grow(positions, 0),
    )


@dataclass
class _StaticInputs:
    """What the captured graphs read and write; addresses never change."""

    input_ids: torch.Tensor  # [max_bs] int64
    positions: torch.Tensor  # [max_bs] int64
    out_cache_loc: torch.Tensor  # [max_bs] int64
    hidden: torch.Tensor  # [max_bs, hidden_size]: the model's output


class CudaGraphRunner:
    def __init__(
        self,
        model: nn.Module,
        backend: AttentionBackend,
        kv_pool: KVPool,
        table: DeviceReqToToken,
        max_bs: int,
        hidden_size: int,
        dtype: torch.dtype,
    ) -> None:
        if not backend.supports_cuda_graph:
            raise ValueError(f"{type(backend).__name__} cannot run under CUDA graphs")
        device = table.device
        self.model, self.backend, self.kv_pool, self.table = model, backend, kv_pool, table
        self.sizes = capture_batch_sizes(max_bs)
        self.static = _StaticInputs(
            input_ids=torch.zeros(max_bs, dtype=torch.int64, device=device),
            positions=torch.zeros(max_bs, dtype=torch.int64, device=device),
            out_cache_loc=torch.zeros(max_bs, dtype=torch.int64, device=device),
            hidden=torch.zeros(max_bs, hidden_size, dtype=dtype, device=device),
        )
        backend.init_cuda_graph_state(max_bs, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._capture_all()

    @property
    def max_bs(self) -> int:
        return self.sizes[-1]

    def can_run(self, batch_size: int) -> bool:
        return 1 <= batch_size <= self.max_bs

    def _context(self, req_rows: torch.Tensor, prefix_lens: list[int]) -> ForwardContext:
        bs = len(prefix_lens)
        return ForwardContext(
            is_decode=True,
            req_rows=req_rows,
            prefix_lens=prefix_lens,
            extend_lens=[1] * bs,
            out_cache_loc=self.static.out_cache_loc[:bs],
            req_to_token=self.table.table,
            kv_pool=self.kv_pool,
            attn_backend=self.backend,
        )

    def _forward(self, bs: int) -> None:
        s = self.static
        s.hidden[:bs] = self.model(s.input_ids[:bs], s.positions[:bs])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        for bs in reversed(self.sizes):
            ctx = self._context(torch.full((bs,), self.table.dummy_row, dtype=torch.int64), [0] * bs)
            self.backend.init_forward_metadata_capture(ctx)
            graph = torch.cuda.CUDAGraph()
            with forward_context(ctx, init_metadata=False):
                # Warm up on a side stream, as capture does, so lazy initialisation (Triton
                # compiles, cuBLAS workspaces) happens outside the recording.
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    self._forward(bs)
                torch.cuda.current_stream().wait_stream(stream)
                torch.cuda.synchronize()
                with torch.cuda.graph(graph, pool=pool):
                    self._forward(bs)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def replay(
        self,
        req_rows: torch.Tensor,
        prefix_lens: list[int],
        out_cache_loc: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states ``[bs, hidden]`` of one decode step (a view of the graph's output
        buffer: valid until the next replay)."""
        bs = len(prefix_lens)
        size = padded_batch_size(bs, self.sizes)
        if size is None:
            raise ValueError(f"decode batch of {bs} exceeds the largest captured graph ({self.max_bs})")
        batch = pad_decode_batch(req_rows, prefix_lens, out_cache_loc, input_ids, positions, size, self.table.dummy_row)
        s = self.static
        device = s.input_ids.device
        packed = torch.stack([batch.input_ids, batch.positions, batch.out_cache_loc]).pin_memory()
        packed = packed.to(device, non_blocking=True)
        s.input_ids[:size].copy_(packed[0])
        s.positions[:size].copy_(packed[1])
        s.out_cache_loc[:size].copy_(packed[2])
        self.backend.init_forward_metadata_replay(self._context(batch.req_rows, batch.prefix_lens))
        self.graphs[size].replay()
        return s.hidden[:bs]
