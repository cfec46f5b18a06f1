"""Decode steps of forks that share a long prompt, with the CPU attention kernel attending the
shared keys once per group of forks against once per fork, alternating in one process (so
that the machine's drift hits both sides alike):

    python -m bench_agent.bench_shared_decode
    python -m bench_agent.bench_shared_decode --prompt 3000 --forks 8 16 --rounds 4
    python -m bench_agent.bench_shared_decode --dtype float32 --prompt 800 --min-keys 512
    python -m bench_agent.bench_shared_decode --dtype float32 --prompt 210 --own 400 --min-keys 128

Each round prefills a fresh random prompt (cached), then decodes ``--forks`` requests that
each add a few tokens of their own to it, as parallel samples or tree-of-thought branches
do (``--own``: more of their own, as chats that share only a system prompt); the figure is
the mean decode step. The setting is ``paged_attention_set_shared_min_keys``
(kernels/cpu/paged_attention.cpp): the engine's (its K/V type's default, or lowered where the
GEMMs run on AMX tiles; or ``--min-keys``) against never; on a CPU with AMX tiles also the
grouped keys on AVX-512 vectors instead of tiles (``paged_attention_set_shared_on_tiles``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable

NEVER = 2**62


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", type=int, default=3000, help="shared prompt tokens (default: %(default)s)")
    ap.add_argument("--forks", type=int, nargs="*", default=[8, 16], help="requests decoding on one prompt")
    ap.add_argument("--own", type=int, default=4,
                    help="each fork's own prompt tokens after the shared ones (default: %(default)s)")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens each fork decodes (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=4, help="runs per side and case (default: %(default)s)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                    help="the engine's dtype (default: %(default)s; float32 is what CPUs without AVX-512 serve)")
    ap.add_argument("--min-keys", type=int, default=None,
                    help="shared keys from which forks attend them once per group (default: the engine's own)")
    ns = ap.parse_args(argv)

    import torch  # noqa: F401  (its OpenMP runtime first, as kernels/cpu/build.py needs)

    from bench_agent.bench_kernel_ab import alternate, mean_decode_step
    from kernels.cpu import build
    from kernels.cpu.gemm_choice import amx_available
    from runtime import Engine

    engine = Engine(dtype=ns.dtype)
    lib = build.load_kernels()
    default = lib.paged_attention_set_shared_min_keys(NEVER) if ns.min_keys is None else ns.min_keys
    lib.paged_attention_set_shared_min_keys(default)
    rng = random.Random(0)

    def decode_step(forks: int) -> float:
        prompt = [rng.randrange(100, 40_000) for _ in range(ns.prompt)]
        engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 1, "temperature": 0})
        return mean_decode_step(engine, [prompt + [rng.randrange(100, 40_000) for _ in range(ns.own)] for _ in range(forks)],
                                ns.new_tokens)

    def setting(min_keys: int, tiles: bool = True) -> Callable[[], None]:
        return lambda: (lib.paged_attention_set_shared_min_keys(min_keys), lib.paged_attention_set_shared_on_tiles(tiles))

    tiles = amx_available()
    grouped = "shared keys once per group (on tiles)" if tiles else "shared keys once per group"
    sides = {grouped: setting(default), "once per fork": setting(NEVER)}
    if tiles:
        sides["once per group on vectors"] = setting(default, tiles=False)
    columns = " | ".join(f"{name}: slower by" for name in list(sides)[1:])
    print(f"| forks of a {ns.prompt}-token prompt | " + " | ".join(sides) + f" | {columns} |")
    print("|---" * (2 * len(sides)) + "|")
    for forks in ns.forks:
        times = alternate(sides, lambda forks=forks: decode_step(forks), ns.rounds)
        setting(default)()
        means = [statistics.mean(times[name]) for name in sides]
        print(f"| {forks} | " + " | ".join(f"{m * 1e3:.1f} ms" for m in means) + " | "
              + " | ".join(f"{m / means[0]:.2f}x" for m in means[1:]) + " |")
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
