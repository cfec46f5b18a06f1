"""Whole float32 decode steps with the weights' quantized blocks against the float32 panels
alone, alternating in one process (so that the machine's drift hits every side alike):

    python -m bench_agent.bench_weight_blocks
    python -m bench_agent.bench_weight_blocks --batch 1 2 4 5 8 --rounds 6

The engine serves the default model in float32 through the compiled decoder layers. Three
sides: every product on the float32 panels ("panels"); the layers' blocks
(``kernels/cpu/linear_blocks.cpp``; the default model's are 4-bit, taken for up to
``linear_blocks.Q4_1.few_rows()`` rows) as the worker built the layer table ("layers"); and
the output layer's blocks too (8-bit, up to ``linear_blocks.Q8_0.few_rows()`` rows), as the
server runs ("all"). ``--model`` takes another model, e.g. a Q8_0 copy of the default one
(``python -m bench_agent.requantize_gguf``). Each round decodes 24 tokens for each of
``--batch`` requests of ``--context`` random tokens; the figure is the mean decode step.
Needs a CPU with AVX2 and FMA (the float32 GEMM's).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
from typing import Any

BLOCKS = ("qkv_blocks", "o_blocks", "gate_up_blocks", "down_blocks")


def output_layer(model: Any) -> tuple[Any, str]:
    """The module that holds the output layer's packed weight and that attribute's name."""
    return (model, "packed_tied_head") if model.lm_head is None else (model.lm_head, "packed_weight")


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
    model = engine.worker.model
    runner = model.compiled_layers
    if runner is None:
        raise SystemExit("the compiled float32 decoder layers are not in use here (they need AVX2 without AVX-512)")
    kept = [[getattr(layer, name) for name in BLOCKS] for layer in runner._layers]
    holder, attr = output_layer(model)
    head = getattr(holder, attr)
    if not any(any(ptrs) for ptrs in kept) and head.few_rows is None:
        raise SystemExit("this model's weights have no quantized blocks: nothing to compare")

    def use(layers: bool, out: bool) -> None:
        for layer, ptrs in zip(runner._layers, kept, strict=True):
            for name, ptr in zip(BLOCKS, ptrs, strict=True):
                setattr(layer, name, ptr if layers else None)
        setattr(holder, attr, head if out else dataclasses.replace(head, few_rows=None, blocks=None))

    seed = iter(range(10**9))

    def decode(batch: int) -> float:
        r = random.Random(next(seed))
        return mean_decode_step(engine, [[r.randrange(100, 40_000) for _ in range(ns.context)] for _ in range(batch)],
                                24)

    sides = {"panels": lambda: use(False, False), "layers": lambda: use(True, False), "all": lambda: use(True, True)}
    print(f"| requests ({ns.context}-token contexts) | panels (ms) | layers' blocks (ms) | all blocks (ms) "
          "| panels / layers' blocks (middle half) | panels / all blocks (middle half) |\n|---|---|---|---|---|---|")
    try:
        for batch in ns.batch:
            decode(batch)  # warm up
            times = alternate(sides, lambda batch=batch: decode(batch), ns.rounds)
            ms = " | ".join(f"{statistics.median(times[side]) * 1e3:.1f}" for side in sides)
            ratios = " | ".join("{1:.3f}x ({0:.3f}-{2:.3f})".format(*paired_ratio(times["panels"], times[side]))
                                for side in ("layers", "all"))
            print(f"| {batch} | {ms} | {ratios} |", flush=True)
    finally:
        use(True, True)
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
