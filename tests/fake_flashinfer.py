"""A plain-PyTorch stand-in for the part of FlashInfer's Python API that
``kernels/attention/flashinfer_backend.py`` calls, following FlashInfer's documented
semantics, so the backend's planning, index building and merging can run on CPU.

It is a test double, not FlashInfer: it checks how the backend *uses* the API (plan before
run, CSR shapes and dtypes, NHD pages of one token, causal alignment, base-2 log-sum-exp,
graph-mode buffers) against an independent implementation of what those calls mean. The
real kernels are exercised only on a GPU, by ``tests/gpu``.

Semantics mirrored:
  - ``plan`` takes host ``int32`` indptr arrays of length ``batch + 1``; page indices are
    ``int32``; ``run`` uses the last plan;
  - causal prefill aligns queries to the end of their KV: query ``i`` of ``qo_len`` sees KV
    positions ``<= kv_len - qo_len + i``;
  - ``return_lse`` gives the log-sum-exp of the scaled scores in base 2, ``[tokens, heads]``
    float32; ``merge_state`` merges two such states; an empty KV range has ``lse = -inf``;
  - a decode wrapper made with ``use_cuda_graph=True`` copies its plan into the buffers it
    was given and reads them when it runs.
"""

from __future__ import annotations

import importlib.machinery
import math
import types
from typing import Any

import torch

LN2 = math.log(2.0)


def _check_indptr(indptr: torch.Tensor, batch_size: int | None = None) -> list[int]:
    assert indptr.device.type == "cpu" and indptr.dtype == torch.int32, "indptr must be a host int32 tensor"
    values = indptr.tolist()
    assert values[0] == 0 and all(b >= a for a, b in zip(values, values[1:], strict=False)), values
    if batch_size is not None:
        assert len(values) == batch_size + 1
    return values


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [n, H, D]``, ``k``/``v [m, KVH, D]`` -> output ``[n, H, D]`` and base-2 lse ``[n, H]``."""
    n, heads, dim = q.shape
    m = k.shape[0]
    if m == 0:
        return torch.zeros(n, heads, dim), torch.full((n, heads), float("-inf"))
    group = heads // k.shape[1]
    kk, vv = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scores = torch.einsum("nhd,mhd->hnm", q.float(), kk) * scale
    if causal:
        visible = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)  # [H, n], natural log
    out = torch.einsum("hnm,mhd->nhd", torch.softmax(scores, -1), vv)
    return out, (lse / LN2).transpose(0, 1).contiguous()


class _Wrapper:
    def __init__(self, workspace: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False, backend: str = "auto", **buffers: Any) -> None:
        assert workspace.dtype == torch.uint8 and kv_layout == "NHD"
        assert backend in ("auto", "fa2", "fa3")
        self.use_cuda_graph = use_cuda_graph
        self.buffers = buffers
        self.plan_args: dict[str, Any] | None = None
        self.plans = 0

    def _planned(self) -> dict[str, Any]:
        assert self.plan_args is not None, "run before plan"
        return self.plan_args

    @staticmethod
    def _pages(cache: Any, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = cache
        assert k.dim() == 4 and k.shape[1] == page_size == 1, "NHD pages of one token: [pages, 1, KVH, D]"
        return k[:, 0], v[:, 0]


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, *, causal=False, sm_scale=None, q_data_type=None, kv_data_type=None):  # noqa: ANN001
        qo, kv = _check_indptr(qo_indptr), _check_indptr(kv_indptr, len(qo_indptr) - 1)
        self.plan_args = dict(qo=qo, kv=kv, heads=(num_qo_heads, num_kv_heads, head_dim_qk), causal=causal, scale=sm_scale, dtype=q_data_type)
        self.plans += 1

    def run(self, q, k, v, return_lse=False):  # noqa: ANN001
        p = self._planned()
        assert q.shape[1:] == (p["heads"][0], p["heads"][2]) and k.shape[1] == p["heads"][1] and q.dtype == p["dtype"]
        out, lse = torch.empty(q.shape), torch.empty(q.shape[:2])
        for i in range(len(p["qo"]) - 1):
            qs, ks = slice(p["qo"][i], p["qo"][i + 1]), slice(p["kv"][i], p["kv"][i + 1])
            out[qs], lse[qs] = _attend(q[qs], k[ks], v[ks], p["causal"], p["scale"])
        return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim_qk, page_size, *, causal=False, sm_scale=None, q_data_type=None, kv_data_type=None):  # noqa: ANN001
        qo = _check_indptr(qo_indptr)
        kv = _check_indptr(paged_kv_indptr, len(qo) - 1)
        assert paged_kv_indices.dtype == torch.int32 and paged_kv_indices.numel() >= kv[-1]
        assert paged_kv_last_page_len.tolist() == [1] * (len(qo) - 1)
        self.plan_args = dict(
            qo=qo, kv=kv, indices=paged_kv_indices[: kv[-1]].clone(), heads=(num_qo_heads, num_kv_heads, head_dim_qk),
            page_size=page_size, causal=causal, scale=sm_scale, dtype=q_data_type,
        )
        self.plans += 1

    def run(self, q, paged_kv_cache, return_lse=False):  # noqa: ANN001
        p = self._planned()
        k_cache, v_cache = self._pages(paged_kv_cache, p["page_size"])
        out, lse = torch.empty(q.shape), torch.empty(q.shape[:2])
        for i in range(len(p["qo"]) - 1):
            qs, pages = slice(p["qo"][i], p["qo"][i + 1]), p["indices"][p["kv"][i] : p["kv"][i + 1]].long()
            out[qs], lse[qs] = _attend(q[qs], k_cache[pages], v_cache[pages], p["causal"], p["scale"])
        return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    def __init__(self, workspace: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False, use_tensor_cores: bool = False, **kwargs: Any) -> None:
        super().__init__(workspace, kv_layout, use_cuda_graph, **kwargs)
        self.use_tensor_cores = use_tensor_cores
        if use_cuda_graph:
            self.fixed_batch_size = len(self.buffers["paged_kv_last_page_len_buffer"])
            assert len(self.buffers["paged_kv_indptr_buffer"]) == self.fixed_batch_size + 1

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *, pos_encoding_mode="NONE", q_data_type=None, kv_data_type=None, sm_scale=None):  # noqa: ANN001
        bs = len(last_page_len)
        kv = _check_indptr(indptr, bs)
        assert indices.dtype == torch.int32 and pos_encoding_mode == "NONE"
        if self.use_cuda_graph:
            assert bs == self.fixed_batch_size, "a graph wrapper plans only its own batch size"
            self.buffers["paged_kv_indptr_buffer"].copy_(indptr)
            self.buffers["paged_kv_indices_buffer"][: kv[-1]].copy_(indices[: kv[-1]])
            self.buffers["paged_kv_last_page_len_buffer"].copy_(last_page_len)
        else:
            self.buffers = {"paged_kv_indptr_buffer": indptr.clone(), "paged_kv_indices_buffer": indices[: kv[-1]].clone()}
        self.plan_args = dict(heads=(num_qo_heads, num_kv_heads, head_dim), page_size=page_size, scale=sm_scale, dtype=q_data_type)
        self.plans += 1

    def run(self, q, paged_kv_cache):  # noqa: ANN001
        p = self._planned()
        k_cache, v_cache = self._pages(paged_kv_cache, p["page_size"])
        kv = self.buffers["paged_kv_indptr_buffer"].tolist()  # what the kernel would read
        indices = self.buffers["paged_kv_indices_buffer"]
        assert q.shape[0] == len(kv) - 1 and q.dtype == p["dtype"]
        out = torch.empty(q.shape)
        for i in range(q.shape[0]):
            pages = indices[kv[i] : kv[i + 1]].long()
            out[i : i + 1] = _attend(q[i : i + 1], k_cache[pages], v_cache[pages], False, p["scale"])[0]
        return out.to(q.dtype)


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention states whose lse are in base 2."""
    s_max = torch.maximum(s_a, s_b)
    s_max = torch.where(torch.isinf(s_max), torch.zeros_like(s_max), s_max)
    w_a, w_b = torch.exp2(s_a - s_max), torch.exp2(s_b - s_max)
    v = (v_a.float() * w_a[..., None] + v_b.float() * w_b[..., None]) / (w_a + w_b)[..., None]
    return v.to(v_a.dtype), s_max + torch.log2(w_a + w_b)


def fake_flashinfer_module() -> types.ModuleType:
    module = types.ModuleType("flashinfer")
    module.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    module.__version__ = "test double"
    for obj in (BatchPrefillWithRaggedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, BatchDecodeWithPagedKVCacheWrapper, merge_state):
        setattr(module, obj.__name__, obj)
    return module
