"""Python entry points of the compiled paged-attention kernel and of the KV store that
feeds it (``paged_attention.cpp``).

The kernel gets raw pointers, so everything it reads is checked here first: dtypes,
contiguity, devices and shapes. A mistake becomes a ``ValueError``, never a stray read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kernels.cpu import entry_checks
from kernels.cpu.entry_checks import SUFFIX, check_cpu, kernel, token_stride


@dataclass
class PagedBatch:
    """Which keys each query token sees, as int64 CPU tensors.

    Query token ``t`` belongs to request ``b = token_req[t]``; it is token
    ``t - q_start[b]`` of that request's new tokens and sees the request's first
    ``prefix[b] + (t - q_start[b]) + 1`` tokens, at slots ``req_to_token[rows[b], :]``.
    """

    req_to_token: torch.Tensor  # [max_requests, max_context_len]
    rows: torch.Tensor  # [bs]
    prefix: torch.Tensor  # [bs]
    q_start: torch.Tensor  # [bs]
    token_req: torch.Tensor  # [num_tokens]
    max_keys: int  # the most keys any query token sees

    def check(self, num_tokens: int) -> None:
        """Raise ``ValueError`` unless every index tensor is what the kernels read through raw
        pointers: contiguous int64 on the CPU, a 2-D table covering ``max_keys``, one entry
        per request in ``rows``/``prefix``/``q_start`` and one per query token in ``token_req``."""
        bs = self.rows.numel()
        for name, t, size in (("req_to_token", self.req_to_token, None), ("rows", self.rows, bs),
                              ("prefix", self.prefix, bs), ("q_start", self.q_start, bs),
                              ("token_req", self.token_req, num_tokens)):
            if t.dtype != torch.int64 or t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError(f"paged batch: {name} must be a contiguous int64 CPU tensor")
            if size is not None and t.shape != (size,):
                raise ValueError(f"paged batch: {name} has shape {tuple(t.shape)}, expected ({size},)")
        if self.req_to_token.dim() != 2 or self.max_keys > self.req_to_token.shape[1]:
            raise ValueError(f"a request sees {self.max_keys} keys, more than the table's "
                             f"{self.req_to_token.shape[-1]} columns")

    @classmethod
    def build(cls, req_to_token: torch.Tensor, rows: torch.Tensor, prefix_lens: list[int],
              extend_lens: list[int]) -> PagedBatch:
        if len(rows) and not 0 <= int(rows.min()) <= int(rows.max()) < req_to_token.shape[0]:
            raise ValueError(f"request rows {rows.tolist()} outside the table's {req_to_token.shape[0]} rows")
        extend = torch.tensor(extend_lens, dtype=torch.int64)
        prefix = torch.tensor(prefix_lens, dtype=torch.int64)
        return cls(
            req_to_token=req_to_token,
            rows=rows.to(device="cpu", dtype=torch.int64).contiguous(),
            prefix=prefix,
            q_start=torch.cumsum(extend, 0) - extend,
            token_req=torch.repeat_interleave(torch.arange(len(extend_lens)), extend),
            max_keys=max((p + e for p, e in zip(prefix_lens, extend_lens, strict=True)), default=0),
        )


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """``KVPool.write`` for the HND layout in one pass: ``k``/``v`` (``[tokens, kv_heads, dim]``,
    views into the QKV projection are fine) into slots ``loc`` of one layer's pool tensors
    (``[kv_heads, num_slots, dim]``)."""
    kv_heads, num_slots, dim = k_cache.shape
    k_stride, v_stride = token_stride(k, "store_kv: k"), token_stride(v, "store_kv: v")
    if v_cache.shape != k_cache.shape or k.shape != v.shape or k.shape[1:] != (kv_heads, dim):
        raise ValueError(f"store_kv: k {tuple(k.shape)}, v {tuple(v.shape)} do not fit the pool {tuple(k_cache.shape)}")
    if k_cache.dtype not in SUFFIX or {v_cache.dtype, k.dtype, v.dtype} != {k_cache.dtype}:
        raise ValueError("store_kv: k, v and the pool must share one dtype among float32/bfloat16")
    if loc.dtype != torch.int64 or loc.shape != (k.shape[0],) or not loc.is_contiguous():
        raise ValueError(f"store_kv: loc must be a contiguous int64 [{k.shape[0]}] tensor")
    check_cpu(k_cache, v_cache, loc, k, v)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("store_kv: the pool tensors must be contiguous")
    status = kernel("store_kv", k.dtype)(
        k.data_ptr(), k_stride, v.data_ptr(), v_stride, loc.data_ptr(), k.shape[0], kv_heads, dim, k_cache.data_ptr(),
        v_cache.data_ptr(), num_slots, torch.get_num_threads())
    if status:
        raise ValueError(f"store_kv: a slot in loc is outside the pool's {num_slots} slots")


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
                    scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``q`` (``[num_tokens, heads, dim]``) over the K/V pool of one layer
    (``[kv_heads, num_slots, dim]``, the HND layout) through ``batch``'s slots."""
    num_tokens, num_heads, dim = q.shape
    kv_heads, num_slots, cache_dim = k_cache.shape
    if q.dtype not in SUFFIX or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"paged_attention needs q and K/V of one dtype among float32/bfloat16, got "
                         f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if v_cache.shape != k_cache.shape or cache_dim != dim or num_heads % kv_heads:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    batch.check(num_tokens)
    out = torch.empty_like(q) if out is None else out
    for t in (q, k_cache, v_cache, out):
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError("paged_attention reads contiguous CPU tensors only")
    if out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError("paged_attention: out must be shaped like q, of its dtype")
    status = kernel("paged_attention", q.dtype)(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), num_slots, batch.req_to_token.data_ptr(),
        batch.req_to_token.shape[1], batch.rows.data_ptr(), batch.prefix.data_ptr(), batch.q_start.data_ptr(),
        batch.token_req.data_ptr(), num_tokens, num_heads, kv_heads, dim, scale, batch.max_keys, out.data_ptr(),
        torch.get_num_threads())
    if status:
        raise ValueError(f"paged_attention supports head_dim <= 256 and <= 16 query heads per KV head; "
                         f"got head_dim {dim}, {num_heads // kv_heads} per KV head")
    return out


def shared_prefix_groups(batch: PagedBatch, num_heads: int, kv_heads: int, head_dim: int) -> list[tuple[list[int], int]]:
    """The decode tokens of a bfloat16 step that ``paged_attention`` would attend in groups,
    their common first keys once for the whole group: (query tokens, shared keys) per group."""
    num_tokens = batch.token_req.numel()
    batch.check(num_tokens)
    group_of = torch.empty(num_tokens, dtype=torch.int64)
    keys = torch.empty(num_tokens, dtype=torch.int64)
    count = entry_checks.load_kernels().paged_attention_shared_groups(
        0, batch.req_to_token.data_ptr(),
        batch.req_to_token.shape[1], batch.rows.data_ptr(), batch.prefix.data_ptr(), batch.q_start.data_ptr(),
        batch.token_req.data_ptr(), num_tokens, num_heads, kv_heads, head_dim, group_of.data_ptr(), keys.data_ptr())
    return [([t for t, g in enumerate(group_of.tolist()) if g == i], int(keys[i])) for i in range(count)]


def last_grouped_tokens() -> int:
    """How many decode tokens the last ``paged_attention`` call attended in groups."""
    return int(entry_checks.load_kernels().paged_attention_last_grouped_tokens())


@contextlib.contextmanager
def _kernel_setting(setter: str, value: int) -> Iterator[None]:
    """Inside the block, the library's setting ``setter`` (an entry that sets a value and
    returns the previous one) holds ``value``; the previous value comes back after."""
    set_value = getattr(entry_checks.load_kernels(), setter)
    previous = set_value(value)
    try:
        yield
    finally:
        set_value(previous)


# ``shared_min_keys``' value for "each K/V storage type's own default" (bfloat16 1,024 keys,
# float32 256: paged_attention.cpp says why).
DEFAULT_SHARED_MIN_KEYS = -1


def shared_min_keys(keys: int) -> contextlib.AbstractContextManager[None]:
    """Inside the block, decode tokens whose requests share at least ``keys`` first keys
    attend them together, whatever their K/V storage type (the kernel's setting, for tests:
    its defaults need long prompts; ``DEFAULT_SHARED_MIN_KEYS``: each type's default)."""
    return _kernel_setting("paged_attention_set_shared_min_keys", keys)


def grouping_min_keys(dtype: torch.dtype) -> int:
    """The shared keys from which decode tokens of a ``dtype`` K/V cache attend them together now."""
    return int(entry_checks.load_kernels().paged_attention_shared_min_keys(int(dtype == torch.float32)))


def shared_min_rows(rows: int) -> contextlib.AbstractContextManager[None]:
    """Inside the block, a group of decode tokens needs at least ``rows`` query rows (tokens
    times query heads per KV head) to attend its shared keys together."""
    return _kernel_setting("paged_attention_set_shared_min_rows", rows)


# Where the GEMMs run on AMX tiles, decode steps spend a larger share in attention, and the
# shared keys are attended on tiles too (attend_shared_amx), which costs about the same for
# 2 rows as for 16: forks group from 6 query rows (2 forks of the default model) sharing 256
# keys. Measured on an Intel Xeon with AMX (family 6 model 167, 2 cores), whole decode steps
# of 8 programs' forks on 466-token prompts, alternating in one process: 2 forks each
# 39.5 -> 34.1 ms, 4 forks 53.3 -> 45.5 ms, against the vector kernel grouping from 12 rows
# (what was kept before the tiles); the attention alone of the 2-fork step (30 layers) 16.2
# ungrouped -> 14.7 ms grouped on tiles, 19.3 grouped on vectors. Without AMX, grouping on
# vectors measured 0.99x (4 x 4 forks of 440 tokens), so the kernel's defaults (24 rows,
# 1,024 keys) stay there.
AMX_SHARED_MIN_ROWS = 6
AMX_SHARED_MIN_KEYS = 256


def shared_on_tiles(on: bool) -> contextlib.AbstractContextManager[None]:
    """Inside the block, grouped decode tokens attend their shared keys on AMX tiles (where
    this CPU and build have them; the default) or on AVX-512 vectors (``on=False``)."""
    return _kernel_setting("paged_attention_set_shared_on_tiles", int(on))


def bf16_rows_on_avx2(on: bool) -> contextlib.AbstractContextManager[None]:
    """Inside the block (``on=True``), bfloat16 extend tasks and groups' shared keys run on the
    AVX2 kernel that CPUs without AVX512-BF16 use (``attention_rows_avx2.cpp``), even where
    the AVX512-BF16 and AMX ones exist: for tests, so every machine checks that kernel."""
    return _kernel_setting("paged_attention_set_bf16_rows_avx2", int(on))


def last_shared_on_tiles() -> int:
    """How many shared-key tasks of the last bfloat16 ``paged_attention`` call ran on AMX tiles."""
    return int(entry_checks.load_kernels().paged_attention_last_shared_on_tiles())


def last_shared_extend_blocks() -> int:
    """How many 32-key blocks the last AMX extend attention took from another request of its
    step (the same slots) instead of packing them again."""
    return int(entry_checks.load_kernels().paged_attention_last_shared_extend_blocks())


def use_amx_grouping_thresholds() -> None:
    """Lower the decode-grouping thresholds to the AMX ones, for the rest of the process (one
    whose GEMMs run on AMX tiles)."""
    lib = entry_checks.load_kernels()
    lib.paged_attention_set_shared_min_rows(AMX_SHARED_MIN_ROWS)
    lib.paged_attention_set_shared_min_keys(AMX_SHARED_MIN_KEYS)
