"""Which bfloat16 GEMM kernel multiplies a packed weight: chosen by measurement, per machine.

A packed bf16 weight (``linear_bf16.pack``) can be multiplied by three kernels: vdpbf16ps
vectors (``linear_bf16.cpp``, every CPU with AVX512-BF16), the same kernel with the weights
widened to float32 in registers and float32 FMAs (``tile<N, true>``: twice the multiply-adds
per cycle where a CPU retires two 512-bit FMAs per cycle but a vdpbf16ps every other one, as
an Intel Xeon without AMX measured, 338 against 163 GFLOP/s on 2 cores; on AMD Zen 4, whose
512-bit FMAs run at half width, vdpbf16ps should stay the faster), and AMX tiles
(``linear_amx.cpp``, Intel Xeons from Sapphire Rapids on). The widened kernel is measured
like the tiles: for each weight shape, the smallest row count from which it is at least as
fast as vdpbf16ps (``linear_bf16_set_widen_min_rows``; the largest of the model's shapes),
first, so that the tiles are then measured against the faster of the two vector kernels.

Vectors read a weight fastest for a single row; tiles do 8,192 multiply-adds per
instruction and win from a few rows on (on a 2-core Xeon with AMX: ~2 TFLOP/s at 600 rows
against ~160 GFLOP/s). The crossover depends on the machine and
the shape, so it is measured: for each weight shape, both kernels on 1..16 rows, and the
smallest row count from which tiles are at least as fast (see ``measure_crossover``). Products
of that many rows or more go to the tiles (``linear_bf16_set_amx_min_rows``; one setting
per process: the largest crossover of the model's shapes).

Below 8 rows the vector kernel can also prefetch the weights a panel ahead: on an Intel
Xeon that read a model's decode weights ~20% faster, on AMD Zen 4 it cost more than it saved.
``choose_small_prefetch`` measures it on the model's own packed weights (one-row products
over all of them, from memory as in a decode step) and keeps it only where it wins.

The measurements take ~0.1 s per shape and ~0.5 s for the prefetch, and are cached in a
JSON file beside the compiled library (whose name already carries the sources', compiler's
and CPU flags' hash), keyed by shape (or weight size) and thread count, so later starts on
the same machine read them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

from kernels.cpu.build import CpuKernelsUnavailable, find_compiler, library_path, load_kernels

NEVER = 2**63 - 1  # amx_min_rows that keeps every product on the vector kernel
_CACHE_VERSION = 3  # of the measuring rule: a new rule measures anew
CANDIDATE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)


def amx_available() -> bool:
    """Whether this build and operating system let this process multiply on AMX tiles."""
    try:
        return bool(load_kernels().linear_amx_available())
    except CpuKernelsUnavailable:
        return False


def set_amx_min_rows(rows: int) -> int:
    """Send products of ``rows`` rows or more to the AMX kernel; returns the previous value."""
    return int(load_kernels().linear_bf16_set_amx_min_rows(rows))


def set_widen_min_rows(rows: int) -> int:
    """Send vector-kernel products of ``rows`` rows or more to the widened (float32 FMA)
    tiles; returns the previous value."""
    return int(load_kernels().linear_bf16_set_widen_min_rows(rows))


KERNELS = ("vector", "widened", "amx")


@contextlib.contextmanager
def forced(kernel: str) -> Iterator[None]:
    """Every bf16 GEMM in this block on one kernel: ``"vector"`` (vdpbf16ps), ``"widened"``
    (float32 FMAs) or ``"amx"`` (tests)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "amx" and not amx_available():
        raise CpuKernelsUnavailable("this CPU (or its build, or the OS) has no AMX tiles")
    previous_amx = set_amx_min_rows(1 if kernel == "amx" else NEVER)
    previous_widen = set_widen_min_rows(1 if kernel == "widened" else NEVER)
    try:
        yield
    finally:
        set_amx_min_rows(previous_amx)
        set_widen_min_rows(previous_widen)


def best_times(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Each call's best of ``reps`` timings, the calls interleaved so that the machine's drift
    hits all alike, after a first round that warms each up (and its data into cache)."""
    times = dict.fromkeys(calls, float("inf"))
    for rep in range(reps + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if rep:
                times[name] = min(times[name], time.perf_counter() - start)
    return times


def _challenger_wins(challenger: str, in_features: int, out_features: int, threads: int, reps: int) -> list[bool]:
    """For each size of ``CANDIDATE_ROWS``: whether ``challenger`` (``"amx"`` or
    ``"widened"``)'s best of ``reps`` calls is at least as fast as the vector kernel's as
    set now (for ``"widened"``: vdpbf16ps), the two interleaved, on a random weight."""
    from kernels.cpu import linear_bf16

    lib = load_kernels()
    gen = torch.Generator().manual_seed(0)
    packed = linear_bf16.pack(torch.randn(out_features, in_features, generator=gen).bfloat16())
    widen_now = set_widen_min_rows(NEVER)
    set_widen_min_rows(widen_now)

    def widened(*args: object) -> None:
        set_widen_min_rows(1)
        lib.linear_bf16_vector(*args)

    def vector(*args: object) -> None:
        set_widen_min_rows(NEVER if challenger == "widened" else widen_now)
        lib.linear_bf16_vector(*args)

    kernels = {"vector": vector, challenger: lib.linear_amx if challenger == "amx" else widened}
    wins: list[bool] = []
    try:
        for rows in CANDIDATE_ROWS:
            x = torch.randn(rows, in_features, generator=gen).bfloat16()
            out = torch.empty(rows, out_features, dtype=torch.bfloat16)
            args = (x.data_ptr(), rows, in_features, in_features, packed.data_ptr(), out_features, None,
                    out.data_ptr(), out_features, threads)
            times = best_times({name: functools.partial(kernel, *args) for name, kernel in kernels.items()}, reps)
            wins.append(times[challenger] <= times["vector"])
    finally:
        set_widen_min_rows(widen_now)
    return wins


def measure_crossover(in_features: int, out_features: int, threads: int, reps: int = 9, tries: int = 3,
                      challenger: str = "amx") -> int:
    """The smallest row count from which ``challenger`` (the AMX kernel, or the widened
    vector kernel) is at least as fast as the vector kernel, at that size and at 16 rows
    (its advantage grows with the rows; a loss in between is taken for noise). ``NEVER``
    when it loses at 16 rows in each of ``tries`` measurements: another process taking a
    core for a moment can make one measurement lose, and a wrong ``NEVER`` would keep
    prefill on a kernel 1.5x (widened) to 10x (AMX) slower."""
    for _ in range(tries):
        wins = _challenger_wins(challenger, in_features, out_features, threads, reps)
        if wins[-1]:
            return next(rows for rows, win in zip(CANDIDATE_ROWS, wins, strict=True) if win)
    return NEVER


def set_small_prefetch(panels: int) -> int:
    """Vector-kernel products of fewer than 8 rows prefetch ``panels`` panels ahead (0: off);
    returns the previous setting."""
    return int(load_kernels().linear_bf16_set_small_prefetch(panels))


def prefetch_wins(weights: list[tuple[torch.Tensor, int, int]], threads: int, rounds: int = 7,
                  margin: float = 0.03) -> bool:
    """Whether one-row products over every ``(packed, in_features, out_features)`` weight, in
    order (a decode step's reads, mostly from memory), are faster with the small-row prefetch
    on: the median of ``rounds`` passes each way, interleaved, by more than ``margin``."""
    lib = load_kernels()
    calls = []
    for packed, in_features, out_features in weights:
        x = torch.randn(1, in_features).bfloat16()
        out = torch.empty(1, out_features, dtype=torch.bfloat16)
        calls.append((x.data_ptr(), 1, in_features, in_features, packed.data_ptr(), out_features, None,
                      out.data_ptr(), out_features, threads, x, out))
    times: dict[int, list[float]] = {0: [], 1: []}
    previous = set_small_prefetch(0)
    try:
        for rep in range(rounds + 1):  # the first round is a warm-up
            for panels, seconds in times.items():
                set_small_prefetch(panels)
                start = time.perf_counter()
                for call in calls:
                    lib.linear_bf16_vector(*call[:10])
                if rep:
                    seconds.append(time.perf_counter() - start)
    finally:
        set_small_prefetch(previous)
    median = {panels: sorted(seconds)[len(seconds) // 2] for panels, seconds in times.items()}
    return median[1] < (1 - margin) * median[0]


def choose_small_prefetch(weights: list[tuple[torch.Tensor, int, int]], threads: int | None = None) -> bool:
    """Turn the vector kernel's small-row prefetch on in this process when it wins for these
    weights on this machine (cached per total weight size and thread count). Returns it."""
    threads = threads or torch.get_num_threads()
    total_mib = sum(packed.numel() * packed.element_size() for packed, _, _ in weights) >> 20
    wins = cached(f"prefetch:{total_mib}MiB@{threads}", lambda: int(prefetch_wins(weights, threads)))
    set_small_prefetch(wins)
    return bool(wins)


def _cache_file() -> Path:
    compiler = find_compiler()
    if compiler is None:
        raise CpuKernelsUnavailable("no C++ compiler: the CPU kernels are not built")
    return library_path(compiler).with_suffix(f".gemm-v{_CACHE_VERSION}.json")


def cache_file_name() -> str:
    """Where the measured choices are cached (for messages that tell how to measure again)."""
    try:
        return str(_cache_file())
    except CpuKernelsUnavailable:
        return "the GEMM choice cache"


def _read_cache(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else {}


def _write_cache(path: Path, data: dict[str, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".json.tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)  # concurrent starts never read a half-written file


def cached(key: str, measure: Callable[[], int]) -> int:
    """The measured choice ``key`` on this machine: from the cache file, or ``measure()`` now
    (and cached)."""
    path = _cache_file()
    data = _read_cache(path)
    if key not in data:
        data[key] = int(measure())
        _write_cache(path, data)
    return data[key]


def crossovers(shapes: Iterable[tuple[int, int]], threads: int | None = None,
               challenger: str = "amx") -> dict[tuple[int, int], int]:
    """Each ``(in_features, out_features)`` shape's crossover row count for ``challenger``
    (``"amx"`` or ``"widened"``) on this machine with ``threads`` threads (default: torch's),
    from the cache or measured now (and cached). All ``NEVER`` for AMX without AMX."""
    threads = threads or torch.get_num_threads()
    shapes = sorted(set(shapes))
    if challenger == "amx" and not amx_available():
        return dict.fromkeys(shapes, NEVER)
    prefix = "" if challenger == "amx" else f"{challenger}:"
    return {shape: cached(f"{prefix}{shape[0]}x{shape[1]}@{threads}",
                          lambda shape=shape: measure_crossover(*shape, threads, challenger=challenger))
            for shape in shapes}


def choose_widen_for(shapes: Iterable[tuple[int, int]], threads: int | None = None) -> int:
    """Set this process's row threshold for the widened vector kernel, for a model whose
    bf16 weights have these ``(in_features, out_features)`` shapes: the largest of their
    crossovers. Returns it. Call it before ``choose_for``, which measures the tiles against
    the vector kernel as chosen here."""
    rows = max(crossovers(shapes, threads, challenger="widened").values(), default=NEVER)
    set_widen_min_rows(rows)
    return rows


def choose_for(shapes: Iterable[tuple[int, int]], threads: int | None = None) -> int:
    """Set this process's AMX row threshold for a model whose bf16 weights have these
    ``(in_features, out_features)`` shapes: the largest of their crossovers. Returns it."""
    rows = max(crossovers(shapes, threads).values(), default=NEVER)
    set_amx_min_rows(rows)
    return rows


def describe(rows: int, small_prefetch: bool = False, widen_rows: int = NEVER) -> str:
    """The choice in words, for the start-up log."""
    notes = ["prefetching at decode sizes"] if small_prefetch else []
    if widen_rows < NEVER:
        notes.append(f"float32 FMAs on widened weights from {widen_rows} rows")
    if rows >= NEVER and not amx_available():
        notes.append("no AMX here")
    vectors = "AVX512-BF16 vectors" + (f" ({'; '.join(notes)})" if notes else "")
    if rows >= NEVER:
        return f"bf16 GEMM on {vectors}"
    return f"bf16 GEMM on AMX tiles from {rows} rows, {vectors} below"
