"""Attention alone: ``--requests`` requests of ``--new`` query tokens each after ``--cached``
tokens of their own (``--new 1``: a decode step), with the default model's heads (9 query
heads, 3 KV heads, head size 64), through the CPU kernel of one layer
(``kernels/cpu/paged_attention.cpp``), against the machine's multiply-add peak measured in
the same run (``bench_agent.roofline``):

    python -m bench_agent.bench_attention
    python -m bench_agent.bench_attention --cached 0 1500 --new 256 --threads 1 --scattered
    python -m bench_agent.bench_attention --cached 400 1500 --new 1 --requests 16   # decode

The flops counted are the two products' (scores and values: 4 x head size per query head
and key seen), none for the softmax. ``--scattered`` places the requests' tokens in random
pool slots, as after evictions, instead of one run of slots per request. Each case prints
the best round's time per layer, its GFLOP/s and that rate as a share of the peak. The K/V
of one layer is read again each round, so where it fits in the caches it comes from there,
unlike a model's step over all its layers (decode steps: see ``bench_kernel_ab``).
"""

from __future__ import annotations

import argparse

import torch

from bench_agent.roofline import best_seconds, measure_peak_gflop_s
from kernels.cpu.paged_attention import PagedBatch, paged_attention

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def time_case(requests: int, cached: int, new: int, dtype: torch.dtype, scattered: bool,
              rounds: int) -> tuple[float, float]:
    """Best seconds of one layer's attention for the batch, and the flops of its two products."""
    total = cached + new
    gen = torch.Generator().manual_seed(0)
    pool = requests * total + 64
    k = torch.randn(KV_HEADS, pool, HEAD_DIM, generator=gen).to(dtype)
    v = torch.randn(KV_HEADS, pool, HEAD_DIM, generator=gen).to(dtype)
    q = torch.randn(requests * new, HEADS, HEAD_DIM, generator=gen).to(dtype)
    slots = torch.randperm(pool, generator=gen) if scattered else torch.arange(pool)
    table = slots[: requests * total].view(requests, total).clone()
    batch = PagedBatch.build(table, torch.arange(requests), [cached] * requests, [new] * requests)
    out = torch.empty_like(q)

    def call() -> None:
        paged_attention(q, k, v, batch, HEAD_DIM**-0.5, out)

    call(), call()  # warm-up
    best = best_seconds(call, rounds)
    keys_seen = requests * (new * cached + new * (new + 1) // 2)
    return best, 4.0 * keys_seen * HEADS * HEAD_DIM


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="K/V and query dtype (default: %(default)s)")
    ap.add_argument("--cached", type=int, nargs="+", default=[0, 1500, 3000],
                    help="tokens already in the cache before the new ones (default: %(default)s)")
    ap.add_argument("--new", type=int, nargs="+", default=[80, 256],
                    help="new query tokens per request (default: %(default)s)")
    ap.add_argument("--requests", type=int, default=1, help="requests in the batch (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="compute threads (default: %(default)s, torch's)")
    ap.add_argument("--scattered", action="store_true", help="random pool slots instead of one run of slots")
    ap.add_argument("--rounds", type=int, default=20, help="timed calls per case, best kept (default: %(default)s)")
    ns = ap.parse_args(argv)
    if min(ns.cached) < 0 or min(ns.new) < 1 or min(ns.requests, ns.threads, ns.rounds) < 1:
        ap.error("--cached must be >= 0; --new, --requests, --threads and --rounds >= 1")
    torch.set_num_threads(ns.threads)
    dtype = getattr(torch, ns.dtype)
    peak = measure_peak_gflop_s(ns.dtype, ns.threads)
    print(f"{ns.requests} request(s), {ns.dtype}, {ns.threads} thread(s), "
          f"{'scattered' if ns.scattered else 'consecutive'} slots; "
          f"multiply-add peak {peak:.0f} GFLOP/s")
    print("| cached | new | ms per layer | GFLOP/s | of peak |\n|---|---|---|---|---|")
    for cached in ns.cached:
        for new in ns.new:
            seconds, flops = time_case(ns.requests, cached, new, dtype, ns.scattered, ns.rounds)
            rate = flops / seconds / 1e9
            print(f"| {cached} | {new} | {seconds * 1e3:.2f} | {rate:.0f} | {rate / peak:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
