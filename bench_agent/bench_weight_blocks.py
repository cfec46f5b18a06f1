"""Whole float32 decode steps with the layers' 4-bit weight blocks (``kernels/cpu/linear_q4.cpp``)
against the float32 panels alone, alternating in one process (so that the machine's drift
hits both sides alike):

    python -m bench_agent.bench_weight_blocks
    python -m bench_agent.bench_weight_blocks --batch 1 2 4 5 --rounds 6

The engine serves the default model in float32 through the compiled decoder layers; one side
is the layer table as the worker built it (products of up to ``linear_q4.few_rows()`` rows
from the blocks), the other the same table with its blocks pointers cleared (every product
on the float32 panels). Each round decodes 24 tokens for each of ``--batch`` requests of
``--context`` random tokens; the figure is the mean decode step. Needs a CPU with AVX2 and
FMA (the float32 GEMM's).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

BLOCKS = ("qkv_blocks", "o_blocks", "gate_up_blocks", "down_blocks")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 2, 4, 8], help="requests decoding together")
    ap.add_argument("--context", type=int, default=400, help="prompt tokens per request (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=6, help="runs per side and batch (default: %(default)s)")
    ap.add_argument("--model", default=None, help="model path (default: the bundled default model)")
    ns = ap.parse_args(argv)

    import torch  # noqa: F401  (its OpenMP runtime first, as kernels/cpu/build.py needs)

    from bench_agent.bench_kernel_ab import alternate, mean_decode_step, paired_ratio
    from runtime import Engine

    engine = Engine(ns.model, dtype="float32")
    runner = engine.worker.model.compiled_layers
    if runner is None:
        raise SystemExit("the compiled float32 decoder layers are not in use here (they need AVX2 without AVX-512)")
    kept = [[getattr(layer, name) for name in BLOCKS] for layer in runner._layers]
    if not any(any(ptrs) for ptrs in kept):
        raise SystemExit("this model's layers have no 4-bit weight blocks: nothing to compare")

    def use_blocks(on: bool) -> None:
        for layer, ptrs in zip(runner._layers, kept, strict=True):
            for name, ptr in zip(BLOCKS, ptrs, strict=True):
                setattr(layer, name, ptr if on else None)

    seed = iter(range(10**9))

    def decode(batch: int) -> float:
        r = random.Random(next(seed))
        return mean_decode_step(engine, [[r.randrange(100, 40_000) for _ in range(ns.context)] for _ in range(batch)],
                                24)

    print(f"| requests ({ns.context}-token contexts) | with blocks (ms) | float32 panels only (ms) "
          "| panels / blocks (middle half) |\n|---|---|---|---|")
    try:
        for batch in ns.batch:
            decode(batch)  # warm up
            times = alternate({"blocks": lambda: use_blocks(True), "panels": lambda: use_blocks(False)},
                              lambda batch=batch: decode(batch), ns.rounds)
            use_blocks(True)
            low, mid, high = paired_ratio(times["panels"], times["blocks"])
            print(f"| {batch} | {statistics.median(times['blocks']) * 1e3:.1f} | "
                  f"{statistics.median(times['panels']) * 1e3:.1f} | {mid:.3f}x ({low:.3f}-{high:.3f}) |", flush=True)
    finally:
        use_blocks(True)
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
