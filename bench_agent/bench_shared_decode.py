"""Decode steps of forks that share a long prompt, with the CPU attention kernel attending the
shared keys once per group of forks against once per fork, alternating in one process (so
that the machine's drift hits both sides alike):

    python -m bench_agent.bench_shared_decode
    python -m bench_agent.bench_shared_decode --prompt 3000 --forks 8 16 --rounds 4

Each round prefills a fresh random prompt (cached), then decodes ``--forks`` requests that
each add a few tokens of their own to it, as parallel samples or tree-of-thought branches
do; the figure is the mean decode step. The setting is ``paged_attention_set_shared_min_keys``
(kernels/cpu/paged_attention.cpp): its default against never.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

NEVER = 2**62


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", type=int, default=3000, help="shared prompt tokens (default: %(default)s)")
    ap.add_argument("--forks", type=int, nargs="*", default=[8, 16], help="requests decoding on one prompt")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens each fork decodes (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=4, help="runs per side and case (default: %(default)s)")
    ns = ap.parse_args(argv)

    import torch  # noqa: F401  (its OpenMP runtime first, as kernels/cpu/build.py needs)

    from bench_agent.bench_kernel_ab import alternate, mean_decode_step
    from kernels.cpu import build
    from runtime import Engine

    engine = Engine(dtype="bfloat16")
    lib = build.load_kernels()
    default = lib.paged_attention_set_shared_min_keys(NEVER)
    lib.paged_attention_set_shared_min_keys(default)
    rng = random.Random(0)

    def decode_step(forks: int) -> float:
        prompt = [rng.randrange(100, 40_000) for _ in range(ns.prompt)]
        engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 1, "temperature": 0})
        return mean_decode_step(engine, [prompt + [rng.randrange(100, 40_000) for _ in range(4)] for _ in range(forks)],
                                ns.new_tokens)

    settings = {"shared keys once per group": default, "once per fork": NEVER}
    sides = {name: (lambda s=s: lib.paged_attention_set_shared_min_keys(s)) for name, s in settings.items()}
    print(f"| forks of a {ns.prompt}-token prompt | " + " | ".join(sides) + " | speed-up |\n|---|---|---|---|")
    for forks in ns.forks:
        times = alternate(sides, lambda forks=forks: decode_step(forks), ns.rounds)
        lib.paged_attention_set_shared_min_keys(default)
        on, off = (statistics.mean(times[name]) for name in sides)
        print(f"| {forks} | {on * 1e3:.1f} ms | {off * 1e3:.1f} ms | {off / on:.2f}x |")
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
