"""The CPU kernels of this checkout against those of another git revision, in one process:
prefill and decode steps of the default model (the compiled decoder layers, bf16 or
float32) run alternately on the two builds, so the machine's drift (tens of percent over
minutes on shared 2-core machines) hits both sides alike.

    python -m bench_agent.bench_kernel_ab --base HEAD~1
    python -m bench_agent.bench_kernel_ab --base 613896e --prefill 600 2000 --decode 1 16
    python -m bench_agent.bench_kernel_ab --base HEAD~1 --dtype float32   # AVX2-only CPUs
    python -m bench_agent.bench_kernel_ab --base HEAD~1 --prefill 28 --cached 450 --forks 4 --decode

With ``--forks F`` each prefill call is F requests on the same cached prefix, each with its
own new tokens (forks of one prompt prefilling their next turns in one step).

The base revision's ``kernels/cpu`` sources are compiled with this checkout's flags into a
temporary library; only the decoder layers' entry point is swapped, so both sides share
the packed weights (the packed layout must be the same in both revisions) and the kernel
settings measured at start-up (copied to the base library where it has them). Each row
gives each side's median and the median of the per-round ratios, with their middle half.
The base's decoder layers must read this checkout's layer table: bases whose table entries
differ (before the layers took weight blocks in either format) are refused.

Revisions before the kernels' own buffers were 64-byte aligned (``kernels/cpu/aligned.h``)
kept the layers' intermediates in a buffer whose placement varied from build to build and
process to process, and prefill speed with it: against such a base, two builds of the same
sources read from 0.83x to 1.21x of each other (per-round ratios, a 512-token prefill).
"""

from __future__ import annotations

import argparse
import ctypes
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.cli_types import positive_int

REPO = Path(__file__).resolve().parent.parent


def build_revision(rev: str, out_dir: Path) -> ctypes.CDLL:
    """The kernel library of revision ``rev`` (its sources, this checkout's compiler flags)."""
    from kernels.cpu import build

    names = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", f"{rev}:kernels/cpu"],
                           capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        if name.endswith((".cpp", ".h")):
            text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:kernels/cpu/{name}"],
                                  capture_output=True, check=True).stdout
            (out_dir / name).write_bytes(text)
    sources = [str(out_dir / n) for n in names if n.endswith(".cpp")]
    lib = out_dir / "base.so"
    subprocess.run([build.find_compiler(), *build.FLAGS, *sources, "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def check_layer_table(base: ctypes.CDLL, rev: str) -> None:
    """Exit unless ``base``'s decoder layers read the layer table this checkout builds (its
    entries grew with the weights' block pointers and their formats)."""
    from runtime.models.cpu_decoder_layers import layer_table_mismatch

    reason = layer_table_mismatch(base)
    if reason is not None:
        raise SystemExit(f"{rev}: {reason}; pick a base whose kernels read this checkout's layer table, or compare "
                         "whole servers instead")


# The kernel choices this process measured at start-up (kernels/cpu/gemm_choice.py,
# attention_choice.py), set in this checkout's library only: the base library gets the same
# values where it has the setting, or it would run, say, without the small-row prefetch this
# machine chose.
MEASURED_SETTINGS = ("linear_bf16_set_amx_min_rows", "linear_bf16_set_small_prefetch", "linear_bf16_set_widen_min_rows",
                     "paged_attention_set_widened")


def copy_measured_settings(ours: ctypes.CDLL, base: ctypes.CDLL) -> None:
    for name in MEASURED_SETTINGS:
        if not hasattr(base, name):
            continue
        value = getattr(ours, name)(0)
        getattr(ours, name)(value)
        setter = getattr(base, name)
        setter.argtypes, setter.restype = [ctypes.c_int64], ctypes.c_int64
        setter(value)


def alternate(sides: dict[str, Callable[[], None]], measure: Callable[[], float], rounds: int) -> dict[str, list[float]]:
    """``measure()`` ``rounds`` times on each side (``sides[name]()`` switches to it), the sides'
    order reversed every other round, so that the machine's drift hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(rounds):
        for name, switch in list(sides.items())[:: 1 if i % 2 == 0 else -1]:
            switch()
            times[name].append(measure())
    return times


def paired_ratio(base: list[float], ours: list[float]) -> tuple[float, float, float]:
    """The quartiles of ``base[i] / ours[i]``, each a pair of calls made one after the other:
    this machine's speed swings by tens of percent within a minute, so a ratio of whole-run
    means wanders from run to run where the per-pair ratios hold steady."""
    ratios = [b / o for b, o in zip(base, ours, strict=True)]
    q1, q2, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return q1, q2, q3


def mean_decode_step(engine: Any, ids: list[list[int]], new_tokens: int) -> float:
    """Seconds per decode step while ``engine`` generates ``new_tokens`` for each of ``ids``
    (greedy, no early stop), from its step counters."""
    before = engine.core.stats()
    engine.generate(input_ids=ids, sampling_params={"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True})
    after = engine.core.stats()
    return (after["step_decode_seconds"] - before["step_decode_seconds"]) / (
        after["step_decode_steps"] - before["step_decode_steps"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision whose kernels to compare against")
    ap.add_argument("--prefill", type=int, nargs="*", default=[600], help="new prompt tokens per prefill call")
    ap.add_argument("--cached", type=int, default=240, help="cached prefix before each prefill (tokens)")
    ap.add_argument("--decode", type=int, nargs="*", default=[1, 16], help="batch sizes of decode runs")
    ap.add_argument("--forks", type=positive_int, default=1,
                    help="requests per prefill call, all on the same cached prefix (default: %(default)s)")
    ap.add_argument("--rounds", type=positive_int, default=8, help="calls per side and case (default: %(default)s)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                    help="the model's dtype: bfloat16 layers need AVX512-BF16, float32 ones AVX2 and FMA "
                         "without AVX-512 (default: %(default)s)")
    ns = ap.parse_args(argv)

    import torch  # first: its OpenMP runtime before the kernels', as kernels/cpu/build.py needs

    from kernels.cpu import build
    from kernels.cpu.entry_checks import SUFFIX
    from runtime import Engine

    engine = Engine(dtype=ns.dtype)
    runner = engine.worker.model.compiled_layers  # CpuDecoderLayers: all layers as one compiled call
    if runner is None:
        raise SystemExit(f"the compiled decoder layers are not in use here for {ns.dtype} (bfloat16 needs an "
                         "AVX512-BF16 CPU, float32 an AVX2 one without AVX-512); try the other --dtype")
    entry = f"decoder_layers_{SUFFIX[getattr(torch, ns.dtype)]}"
    with tempfile.TemporaryDirectory() as tmp:
        base_lib = build_revision(ns.base, Path(tmp))
        check_layer_table(base_lib, ns.base)
        ours, theirs = getattr(build.load_kernels(), entry), getattr(base_lib, entry)
        theirs.argtypes, theirs.restype = ours.argtypes, ours.restype
        copy_measured_settings(build.load_kernels(), base_lib)
        sides = {"this checkout": ours, ns.base: theirs}
        rng = random.Random(0)
        prefix = [rng.randrange(100, 40_000) for _ in range(ns.cached)]
        seed = iter(range(10**9))

        def prefill(n: int) -> float:
            r = random.Random(next(seed))
            ids = [prefix + [r.randrange(100, 40_000) for _ in range(n)] for _ in range(ns.forks)]
            t = time.perf_counter()
            engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0})
            return time.perf_counter() - t

        def decode(bs: int) -> float:
            r = random.Random(next(seed))
            return mean_decode_step(engine, [[r.randrange(100, 40_000) for _ in range(400)] for _ in range(bs)], 24)

        forks = f"{ns.forks} forks x " if ns.forks > 1 else ""
        cases = [(f"prefill {forks}{n} new tokens after {ns.cached} cached (ms)", prefill, n) for n in ns.prefill]
        cases += [(f"decode step, batch {bs}, 400-token contexts (ms)", decode, bs) for bs in ns.decode]
        print(f"| case | this checkout | {ns.base} | {ns.base} / this checkout (middle half) |\n|---|---|---|---|")
        for label, fn, arg in cases:
            fn(arg)  # warm up
            switches = {name: (lambda entry=entry: setattr(runner, "_run", entry)) for name, entry in sides.items()}
            times = alternate(switches, lambda fn=fn, arg=arg: fn(arg), ns.rounds)
            runner._run = ours
            a, b = (statistics.median(times[name]) for name in sides)
            low, mid, high = paired_ratio(times[ns.base], times["this checkout"])
            print(f"| {label} | {a * 1e3:.1f} | {b * 1e3:.1f} | {mid:.3f}x ({low:.3f}-{high:.3f}) |")
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
