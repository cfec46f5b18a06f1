"""Attention with FlashInfer's batch kernels over the NHD pool, page size 1.

Each token's slot is a page of one token, so a request's pages are exactly its row of the
request-to-token table: ``kv_indptr`` is the running sum of the lengths (computed on the
host, where the lengths already are) and ``kv_indices`` is the rows flattened on the device
by a Triton kernel (``kernels/triton/kv_indices.py``); no slot list crosses from the host.

Every wrapper is planned once per step, in ``init_forward_metadata``, and the plan serves
all layers.

Extend: the new tokens attend causally to each other through the *ragged* prefill kernel,
which reads this step's contiguous K/V with no indirection; when some request has a cached
prefix, a *paged* prefill (not causal: every new token sees the whole prefix) reads the
prefix through the page indices, and the two partial results are merged by their
log-sum-exps (``merge_state``). A batch with no cached prefix, the first prefill of most
prompts, skips the paged pass and the merge. The alternative, storing the new K/V first and
running one causal paged prefill over the whole sequence, would read the new tokens back
through the indices as well; we keep the ragged path for them.

Decode: the paged decode kernel, or, when many query heads share a KV head (GQA ratio >= 4),
the prefill kernel on tensor cores, which handles the head group as a small matrix.

CUDA graphs: one decode wrapper per captured batch size, with fixed index buffers; it is
re-planned before each replay, outside the graph.

Only the FA2 kernels are used: on Hopper FlashInfer could pick FA3, whose just-in-time
build is several times longer, and these small-head models gain little from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch

from kernels.attention.base import AttentionBackend, AttentionShape
from kernels.attention.forward_context import ForwardContext
from kernels.triton.kv_indices import build_kv_indices
from kernels.triton.store_kv import store_kv

WORKSPACE_BYTES = 128 * 1024 * 1024
KERNEL_BACKEND = "fa2"
# GQA ratio from which decode runs on the prefill (tensor-core) kernel.
TENSOR_CORE_MIN_GROUP = 4


def import_flashinfer() -> Any:
    try:
        import flashinfer
    except ImportError as exc:
        raise ValueError(
            "attention backend 'flashinfer' needs the flashinfer-python package: pip install .[cuda]"
        ) from exc
    return flashinfer


@dataclass
class _ExtendPlan:
    has_prefix: bool


@dataclass
class _DecodePlan:
    wrapper: Any  # a planned BatchDecodeWithPagedKVCacheWrapper


def _indptr(lengths: list[int]) -> torch.Tensor:
    """``[0, l0, l0+l1, ...]`` as int32 on the host (FlashInfer plans on the host)."""
    return torch.tensor([0, *accumulate(lengths)], dtype=torch.int32)


def _paged(cache: torch.Tensor) -> torch.Tensor:
    """An NHD pool ``[slots, kv_heads, dim]`` as FlashInfer's pages of one token."""
    return cache.unsqueeze(1)


class FlashInferBackend(AttentionBackend):
    kv_layout = "NHD"
    supports_cuda_graph = True

    def __init__(self, shape: AttentionShape, device: str | torch.device) -> None:
        fi = import_flashinfer()
        self.shape = shape
        self.device = torch.device(device)
        self.scale = shape.head_dim**-0.5
        self.use_tensor_cores = shape.group_size >= TENSOR_CORE_MIN_GROUP
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend=KERNEL_BACKEND)
        self.paged = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=KERNEL_BACKEND)
        self.decode = self._decode_wrapper()
        self._merge_state = fi.merge_state
        self._graph_wrappers: dict[int, Any] = {}
        self._graph_buffers: dict[str, torch.Tensor] = {}
        self._graph_max_bs = 0

    def _decode_wrapper(self, **graph_buffers: torch.Tensor) -> Any:
        fi = import_flashinfer()
        return fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=bool(graph_buffers),
            use_tensor_cores=self.use_tensor_cores,
            backend=KERNEL_BACKEND,
            **graph_buffers,
        )

    def _check_scale(self, scale: float) -> None:
        if abs(scale - self.scale) > 1e-6 * self.scale:
            raise ValueError(f"flashinfer plans with scale {self.scale}; a layer asked for {scale}")

    # ------------------------------------------------------------------ planning
    def _kv_indices(
        self, ctx: ForwardContext, kv_lens: list[int], indptr: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Flatten ``req_to_token[req_rows[i], :kv_lens[i]]`` on the device (into ``out`` if given)."""
        total = int(indptr[-1])
        cols = torch.tensor([ctx.req_rows.tolist(), kv_lens, indptr[:-1].tolist()], dtype=torch.int64)
        if self.device.type == "cuda":
            cols = cols.pin_memory().to(self.device, non_blocking=True)
        indices = out[:total] if out is not None else torch.empty(total, dtype=torch.int32, device=self.device)
        return build_kv_indices(ctx.req_to_token, cols[0], cols[1], cols[2], indices)

    def _plan_decode(self, wrapper: Any, ctx: ForwardContext) -> None:
        indptr = _indptr(ctx.seq_lens)
        indices = self._kv_indices(ctx, ctx.seq_lens, indptr)
        dtype = ctx.kv_pool.k[0].dtype
        wrapper.plan(
            indptr,
            indices,
            torch.ones(ctx.batch_size, dtype=torch.int32),  # every page holds its one token
            self.shape.num_heads,
            self.shape.num_kv_heads,
            self.shape.head_dim,
            1,
            pos_encoding_mode="NONE",
            q_data_type=dtype,
            kv_data_type=dtype,
            sm_scale=self.scale,
        )
        ctx.attn_metadata = _DecodePlan(wrapper)

    def init_forward_metadata(self, ctx: ForwardContext) -> None:
        if ctx.is_decode:
            self._plan_decode(self.decode, ctx)
            return
        dtype = ctx.kv_pool.k[0].dtype
        heads = (self.shape.num_heads, self.shape.num_kv_heads, self.shape.head_dim)
        qo_indptr = _indptr(ctx.extend_lens)
        self.ragged.plan(
            qo_indptr, qo_indptr, *heads, causal=True, sm_scale=self.scale, q_data_type=dtype, kv_data_type=dtype
        )
        has_prefix = any(ctx.prefix_lens)
        if has_prefix:
            kv_indptr = _indptr(ctx.prefix_lens)
            self.paged.plan(
                qo_indptr,
                kv_indptr,
                self._kv_indices(ctx, ctx.prefix_lens, kv_indptr),
                torch.ones(ctx.batch_size, dtype=torch.int32),
                *heads,
                1,
                causal=False,
                sm_scale=self.scale,
                q_data_type=dtype,
                kv_data_type=dtype,
            )
        ctx.attn_metadata = _ExtendPlan(has_prefix)

    # ------------------------------------------------------------------ CUDA graphs
    def init_cuda_graph_state(self, max_batch_size: int, device: torch.device) -> None:
        # Buffers shared by every size's wrapper (as views): one replays at a time, and it is
        # re-planned, rewriting them, just before.
        self._graph_buffers = {
            "paged_kv_indptr_buffer": torch.zeros(max_batch_size + 1, dtype=torch.int32, device=device),
            "paged_kv_last_page_len_buffer": torch.ones(max_batch_size, dtype=torch.int32, device=device),
        }
        self._graph_max_bs = max_batch_size

    def _graph_wrapper(self, ctx: ForwardContext) -> Any:
        bs = ctx.batch_size
        if "paged_kv_indices_buffer" not in self._graph_buffers:
            # Pages can repeat across requests (shared prefixes): bound them by rows x row length.
            self._graph_buffers["paged_kv_indices_buffer"] = torch.zeros(
                self._graph_max_bs * ctx.req_to_token.shape[1], dtype=torch.int32, device=self.device
            )
        if bs not in self._graph_wrappers:
            self._graph_wrappers[bs] = self._decode_wrapper(
                paged_kv_indptr_buffer=self._graph_buffers["paged_kv_indptr_buffer"][: bs + 1],
                paged_kv_indices_buffer=self._graph_buffers["paged_kv_indices_buffer"],
                paged_kv_last_page_len_buffer=self._graph_buffers["paged_kv_last_page_len_buffer"][:bs],
            )
        return self._graph_wrappers[bs]

    def init_forward_metadata_capture(self, ctx: ForwardContext) -> None:
        self._plan_decode(self._graph_wrapper(ctx), ctx)

    def init_forward_metadata_replay(self, ctx: ForwardContext) -> None:
        self._plan_decode(self._graph_wrapper(ctx), ctx)

    # ------------------------------------------------------------------ attention
    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        self._check_scale(scale)
        k_cache, v_cache = ctx.kv_pool.k[layer_id], ctx.kv_pool.v[layer_id]
        store_kv(k, v, k_cache, v_cache, ctx.out_cache_loc)
        k, v = k.contiguous(), v.contiguous()
        plan: _ExtendPlan = ctx.attn_metadata
        if not plan.has_prefix:
            return self.ragged.run(q, k, v)
        out_new, lse_new = self.ragged.run(q, k, v, return_lse=True)
        out_prefix, lse_prefix = self.paged.run(q, (_paged(k_cache), _paged(v_cache)), return_lse=True)
        out, _ = self._merge_state(out_new, lse_new, out_prefix, lse_prefix)
        return out

    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float, ctx: ForwardContext
    ) -> torch.Tensor:
        self._check_scale(scale)
        k_cache, v_cache = ctx.kv_pool.k[layer_id], ctx.kv_pool.v[layer_id]
        store_kv(k, v, k_cache, v_cache, ctx.out_cache_loc)
        plan: _DecodePlan = ctx.attn_metadata
        return plan.wrapper.run(q, (_paged(k_cache), _paged(v_cache)))
