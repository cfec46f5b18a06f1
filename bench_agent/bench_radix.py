"""Micro-benchmark of the radix prefix cache (CPU only; no model).

Run: ``python -m bench_agent.bench_radix`` (``--help`` for the knobs).

1. Replays a synthetic agent trace the way the scheduler drives the cache (match, lock,
   allocate the new tokens evicting when short, insert, free duplicates, unlock) and prints
   match / insert / evict time per 1k tokens and the token hit rate.
2. Times the two targets, as the median of several repetitions:
   (a) matching a fully cached 8,192-token prompt against a tree holding ~1M tokens in many
       branches (target < 1 ms);
   (b) evicting 100k tokens (target < 50 ms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from radix_cache import RadixCache, SlotAllocator

MATCH_TARGET_MS = 1.0
EVICT_TARGET_MS = 50.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench_agent.bench_radix",
        description="Micro-benchmark of radix_cache.RadixCache on a synthetic agent trace.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the numpy RNG that makes every token id and shape",
    )
    p.add_argument(
        "--vocab", type=int, default=49_152, help="vocabulary size token ids are drawn from"
    )
    p.add_argument("--page-size", type=int, default=1, help="RadixCache page_size")
    # -- trace replay
    p.add_argument("--programs", type=int, default=64, help="agent programs in the trace")
    p.add_argument(
        "--system-len",
        type=int,
        default=2_000,
        help="tokens of the system prompt every program shares",
    )
    p.add_argument(
        "--turns",
        type=int,
        default=6,
        help="turns per conversation (each resends the whole history)",
    )
    p.add_argument(
        "--fork-turn",
        type=int,
        default=2,
        help="turn at which each program forks into 2-4 branches",
    )
    p.add_argument(
        "--pool-slots",
        type=int,
        default=262_144,
        help="KV slots in the allocator for the replay (small enough that the replay evicts)",
    )
    # -- targets
    p.add_argument(
        "--tree-tokens",
        type=int,
        default=1_000_000,
        help="tokens in the big tree for targets (a) and (b)",
    )
    p.add_argument(
        "--fork-tail",
        type=int,
        default=1_024,
        help="mean new tokens of each sequence added to the big tree (it forks off an earlier one)",
    )
    p.add_argument(
        "--fork-align",
        type=int,
        default=64,
        help="fork points in the big tree are multiples of this",
    )
    p.add_argument(
        "--match-len",
        type=int,
        default=8_192,
        help="length of the fully cached prompt matched in (a)",
    )
    p.add_argument("--evict-tokens", type=int, default=100_000, help="tokens evicted in (b)")
    p.add_argument(
        "--reps",
        type=int,
        default=30,
        help="repetitions of the match in (a); the median is reported",
    )
    p.add_argument(
        "--evict-reps",
        type=int,
        default=3,
        help="repetitions of the eviction in (b), each on a fresh tree",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (0: leave torch's default). On a busy machine extra threads "
        "stall on large tensor ops, which the numbers would then mostly measure",
    )
    return p.parse_args(argv)


# ====================================================================== trace replay
@dataclass
class Timings:
    match_s: float = 0.0
    insert_s: float = 0.0
    evict_s: float = 0.0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    inserted_tokens: int = 0  # tokens handed to insert()
    evicted_tokens: int = 0
    requests: int = 0
    evict_calls: int = 0
    evict_call_ms: list[float] = field(default_factory=list)


def make_trace(
    args: argparse.Namespace, rng: np.random.Generator
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(prompt, output) requests in arrival order.

    Every program starts with the shared system prompt and its own task, then runs
    ``turns`` turns: each turn resends the whole history, gets an output, and appends the
    output and a tool result. At ``fork_turn`` it forks into 2-4 branches that continue
    on their own. Requests are interleaved round-robin across programs, shuffled per turn.
    """

    def toks(lo: int, hi: int) -> np.ndarray:
        return rng.integers(0, args.vocab, size=int(rng.integers(lo, hi)), dtype=np.int64)

    system = toks(args.system_len, args.system_len + 1)
    histories = [[np.concatenate([system, toks(100, 600)])] for _ in range(args.programs)]
    trace = []
    for turn in range(args.turns):
        if turn == args.fork_turn:
            histories = [[h[0].copy()] * int(rng.integers(2, 5)) for h in histories]
            histories = [[b] for h in histories for b in h]
        order = rng.permutation(len(histories))
        for i in order:
            prompt = histories[i][0]
            output = toks(50, 400)
            trace.append((prompt, output))
            histories[i][0] = np.concatenate([prompt, output, toks(20, 300)])
    return trace


def replay(args: argparse.Namespace, trace: list[tuple[np.ndarray, np.ndarray]]) -> Timings:
    allocator = SlotAllocator(args.pool_slots + 1)
    cache = RadixCache(allocator, page_size=args.page_size)
    t = Timings()
    clock = time.perf_counter
    for prompt, output in trace:
        t0 = clock()
        m = cache.match_prefix(prompt)
        t.match_s += clock() - t0
        cache.inc_lock_ref(m.last_node)
        prefix_len = m.prefix_len
        t.prompt_tokens += len(prompt)
        t.hit_tokens += prefix_len

        full = np.concatenate([prompt, output])
        need = len(full) - prefix_len
        if need > allocator.available:
            t0 = clock()
            freed = cache.evict(need - allocator.available)
            dt = clock() - t0
            t.evict_s += dt
            t.evicted_tokens += freed
            t.evict_calls += 1
            t.evict_call_ms.append(dt * 1e3)
        new = allocator.alloc(need)
        if new is None:
            raise SystemExit("pool too small for one request: raise --pool-slots")
        slots = torch.cat([m.indices, new])  # (the forward pass would run here)

        t0 = clock()
        already = cache.insert(full, slots)
        t.insert_s += clock() - t0
        t.inserted_tokens += len(full)
        aligned = cache.aligned_len(len(full))
        allocator.free(torch.cat([slots[prefix_len:already], slots[aligned:]]))
        cache.dec_lock_ref(m.last_node)
        t.requests += 1
    cache.check_invariants()
    return t


# ====================================================================== targets
def build_big_tree(
    args: argparse.Namespace, rng: np.random.Generator
) -> tuple[RadixCache, list[np.ndarray], np.ndarray, int]:
    """A tree of ~``tree_tokens`` tokens: sequences of ``match_len`` tokens, each forking off
    a random earlier one late in it (``fork_tail`` new tokens on average), so that paths
    cross many branch points. Returns (cache, the sequences, a fully cached ``match_len``
    prompt with the deepest path, its node count)."""
    allocator = SlotAllocator(args.tree_tokens + args.match_len + 2)
    cache = RadixCache(allocator, page_size=args.page_size)
    seqs = [rng.integers(0, args.vocab, size=args.match_len, dtype=np.int64)]
    cache.insert(seqs[0], allocator.alloc(args.match_len))
    while cache.total_size < args.tree_tokens:
        base = seqs[int(rng.integers(len(seqs)))]
        cut = max(args.match_len - int(rng.integers(1, 2 * args.fork_tail)), 0)
        cut -= cut % args.fork_align
        seq = np.concatenate(
            [base[:cut], rng.integers(0, args.vocab, size=args.match_len - cut, dtype=np.int64)]
        )
        slots = allocator.alloc(args.match_len)
        already = cache.insert(seq, slots)
        allocator.free(slots[:already])
        seqs.append(seq)
    # The prompt whose path has the most nodes.
    best, best_depth = seqs[0], 0
    for seq in seqs[-200:]:
        node, depth = cache.match_prefix(seq).last_node, 0
        while not node.is_root:
            node, depth = node.parent, depth + 1
        if depth > best_depth:
            best, best_depth = seq, depth
    return cache, seqs, best, best_depth


def bench_match(args: argparse.Namespace, rng: np.random.Generator) -> dict[str, float]:
    cache, _, prompt, depth = build_big_tree(args, rng)
    prompt_list = prompt.tolist()
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        m = cache.match_prefix(prompt)
        times.append((time.perf_counter() - t0) * 1e3)
        assert m.prefix_len == len(prompt)
    list_times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        cache.match_prefix(prompt_list)
        list_times.append((time.perf_counter() - t0) * 1e3)
    return {
        "tree_tokens": cache.total_size,
        "depth": depth,
        "ms": statistics.median(times),
        "ms_list": statistics.median(list_times),
    }


def bench_evict(args: argparse.Namespace, rng: np.random.Generator) -> dict[str, float]:
    times, freed, leaves = [], 0, 0
    for _ in range(args.evict_reps):
        cache, seqs, _, _ = build_big_tree(args, rng)
        leaves = len(cache._evictable_leaves)
        for i in rng.permutation(len(seqs))[: len(seqs) // 2]:
            cache.match_prefix(seqs[i])  # so that LRU order is not insertion order
        t0 = time.perf_counter()
        freed = cache.evict(args.evict_tokens)
        times.append((time.perf_counter() - t0) * 1e3)
        assert freed >= args.evict_tokens
        cache.check_invariants()
    return {"ms": statistics.median(times), "freed": freed, "leaves": leaves}


# ====================================================================== main
def per_k(seconds: float, tokens: int) -> str:
    return f"{seconds * 1e6 / max(tokens, 1) * 1e3:.1f} µs" if tokens else "n/a"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m bench_agent.bench_radix" + (
        " " + " ".join(argv if argv is not None else sys.argv[1:])
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)

    trace = make_trace(args, rng)
    t0 = time.perf_counter()
    t = replay(args, trace)
    replay_s = time.perf_counter() - t0
    m = bench_match(args, rng)
    e = bench_evict(args, rng)

    hit_rate = t.hit_tokens / max(t.prompt_tokens, 1)
    ok = lambda good: "ok" if good else "MISSED"  # noqa: E731
    print(
        f"command: `{command.strip()}`  (torch {torch.__version__}, numpy {np.__version__}, "
        f"{torch.get_num_threads()} torch thread(s))"
    )
    print()
    print("| measurement | value | target |")
    print("|---|---|---|")
    print(
        f"| trace | {t.requests} requests, {args.programs} programs, {t.prompt_tokens:,} prompt tokens, "
        f"pool {args.pool_slots:,} slots | |"
    )
    print(f"| replay wall time | {replay_s:.2f} s | |")
    print(f"| token hit rate | {hit_rate:.1%} | |")
    print(f"| match time per 1k prompt tokens | {per_k(t.match_s, t.prompt_tokens)} | |")
    print(f"| insert time per 1k inserted tokens | {per_k(t.insert_s, t.inserted_tokens)} | |")
    print(
        f"| evict time per 1k evicted tokens | {per_k(t.evict_s, t.evicted_tokens)} "
        f"({t.evict_calls} calls, {t.evicted_tokens:,} tokens) | |"
    )
    print(
        f"| (a) match {args.match_len:,} cached tokens, tree {m['tree_tokens']:,} tokens, "
        f"path {m['depth']} nodes (median of {args.reps}) | {m['ms']:.3f} ms "
        f"(list input: {m['ms_list']:.3f} ms) | < {MATCH_TARGET_MS:g} ms {ok(m['ms'] < MATCH_TARGET_MS)} |"
    )
    print(
        f"| (b) evict {args.evict_tokens:,} tokens from {e['leaves']:,} leaves, freed {e['freed']:,} "
        f"(median of {args.evict_reps}) | {e['ms']:.2f} ms | < {EVICT_TARGET_MS:g} ms "
        f"{ok(e['ms'] < EVICT_TARGET_MS)} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
