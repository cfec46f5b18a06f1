"""Which multiply-adds the bf16 extend attention uses: chosen by measurement, per machine.

The extend tasks of ``attention_rows.cpp`` (a request's block of query tokens against one KV
head) multiply either with vdpbf16ps on bfloat16 pairs, or with float32 FMAs on queries,
keys and values widened to float32 (``paged_attention_set_widened``). Which is faster
depends on the CPU, as for the GEMM (``gemm_choice.py``): on an Intel Xeon without AMX the
widened products ran 1.5-1.6x faster (head size 64, a few hundred keys and more), and on
AMD Zen 4, whose 512-bit FMAs run at half width, vdpbf16ps should stay the faster. So
``choose_for`` times both on one extend of the model's head geometry (256 new tokens after
768 cached ones; ~3 ms a call on 2 cores for the default model, ~0.1 s in all) and keeps the
faster; the answer is cached with the GEMM's choices (``gemm_choice.cached``), so later
starts on the same machine read it.

Requests that the AMX extend kernel takes (``attention_amx.cpp``) are not affected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from kernels.cpu.build import load_kernels
from kernels.cpu.gemm_choice import NEVER, best_times, cached
from kernels.cpu.paged_attention import PagedBatch, paged_attention

HEAD_DIMS = (64, 128)  # head sizes the extend tasks take (others run per query token)


def set_widened(on: bool) -> bool:
    """bf16 extend tasks on float32 FMAs (``True``) or vdpbf16ps; returns the previous setting."""
    return bool(load_kernels().paged_attention_set_widened(int(on)))


def applies(head_dim: int) -> bool:
    """Whether there is a choice: this build has the bf16 extend tasks, for this head size."""
    return head_dim in HEAD_DIMS and bool(load_kernels().paged_attention_rows_available())


@contextlib.contextmanager
def forced(widened: bool) -> Iterator[None]:
    """Every bf16 extend task in this block on one kind of multiply-add (tests)."""
    previous = set_widened(widened)
    try:
        yield
    finally:
        set_widened(previous)


def widened_wins(num_heads: int, kv_heads: int, head_dim: int, reps: int = 7, new_tokens: int = 256,
                 cached_tokens: int = 768) -> bool:
    """Whether the widened extend is at least as fast as the vdpbf16ps one on torch's
    threads: the best of ``reps`` calls each, interleaved, on one random request of
    ``new_tokens`` after ``cached_tokens``, its K/V at scattered pool slots, off AMX."""
    gen = torch.Generator().manual_seed(0)
    total = cached_tokens + new_tokens
    k_cache, v_cache = (torch.randn(kv_heads, total, head_dim, generator=gen).bfloat16() for _ in range(2))
    q = torch.randn(new_tokens, num_heads, head_dim, generator=gen).bfloat16()
    table = torch.randperm(total, generator=gen).reshape(1, total)
    batch = PagedBatch.build(table, torch.zeros(1, dtype=torch.int64), [cached_tokens], [new_tokens])
    lib = load_kernels()
    previous_amx, previous = lib.paged_attention_set_amx_min_tokens(NEVER), set_widened(False)

    def extend(widened: bool) -> None:
        set_widened(widened)
        paged_attention(q, k_cache, v_cache, batch, head_dim**-0.5)

    try:
        times = best_times({"vdpbf16ps": lambda: extend(False), "widened": lambda: extend(True)}, reps)
    finally:
        set_widened(previous)
        lib.paged_attention_set_amx_min_tokens(previous_amx)
    return times["widened"] <= times["vdpbf16ps"]


def choose_for(num_heads: int, kv_heads: int, head_dim: int) -> bool:
    """Set this process's extend attention to the faster multiply-add for this head geometry
    on this machine and torch's thread count (measured once, then cached). Returns whether
    that is the widened one; ``False`` where there is no choice (``applies``)."""
    if not applies(head_dim):
        set_widened(False)
        return False
    key = f"attention-widened:{num_heads}x{kv_heads}x{head_dim}@{torch.get_num_threads()}"
    widened = bool(cached(key, lambda: int(widened_wins(num_heads, kv_heads, head_dim))))
    set_widened(widened)
    return widened
