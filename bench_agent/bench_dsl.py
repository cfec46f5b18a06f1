"""DSL programs against naive sequential HTTP calls, and program-aware cache pins.

    python -m bench_agent.bench_dsl              # ~10 min on 2 cores
    python -m bench_agent.bench_dsl --quick      # a smoke check

Run from the repository root: the programs are the ones in ``examples/``, which is not an
installed package.

Part 1 (issue target: >= 3x programs/s): the tree-of-thought and self-critique examples
run as DSL programs (all programs at once, forks in parallel, shared prefixes reused) on a
server with the radix cache, against the same programs sent as naive sequential HTTP
calls (one request at a time, nothing prefilled ahead, each select choice scored from its
whole prompt) to a server with the radix cache off. Both servers are up side by side and
idle while the other is measured.

Part 2: program-aware caching under memory pressure. Programs that resend a long private
context, with a tool pause between calls, run while other traffic (unique long prompts)
fills a small KV pool; the same
workload runs with and without pins (``run(..., pin_cache=...)``), alternately; reported:
the programs' prompt tokens served from the cache, and programs/s.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import threading
import time
from typing import Any

import frontend_lang as sgl

try:
    from examples.self_critique import self_critique
    from examples.tree_of_thought import tree_of_thought
except ModuleNotFoundError as err:  # run from elsewhere: examples/ is not installed
    if err.name != "examples":
        raise
    raise SystemExit("bench_dsl runs the programs in examples/: run it from the repository root") from err
from frontend_lang.backend.runtime_endpoint import RuntimeEndpoint
from runtime.server.server_process import ServerProcess


class NaiveHTTPBackend(RuntimeEndpoint):
    """The baseline client: one HTTP request at a time, batches sent one by one, nothing
    prefilled ahead of a fork or a select."""

    can_cache_prefix = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._one_at_a_time = threading.Lock()

    def generate(self, prompt: Any, sampling_params: dict[str, Any], **kw: Any) -> Any:
        if isinstance(prompt, list):
            return [self.generate(p, sampling_params, **kw) for p in prompt]
        with self._one_at_a_time:
            return super().generate(prompt, sampling_params, **kw)

    def end_program(self, program_id: str) -> None:
        pass  # the baseline never pins (its programs run with pin_cache=False anyway)


def _programs(kind: str, n: int) -> list[tuple[Any, dict[str, Any]]]:
    topics = ["traffic", "sleep", "recycling", "learning a language", "saving money", "team meetings", "gardening", "exercise"]
    out = []
    for i in range(n):
        t = topics[i % len(topics)]
        if kind == "tree_of_thought":
            out.append((tree_of_thought, {"question": f"How can people improve {t}? (case {i})", "width": 2, "depth": 2}))
        else:
            out.append((self_critique, {"task": f"Write advice about {t} (case {i}).", "max_rounds": 2, "good_enough": 11}))
    return out


def run_programs(programs: list[tuple[Any, dict[str, Any]]], backend: Any, concurrent_programs: bool, **run_kw: Any) -> tuple[float, list[Any]]:
    start = time.perf_counter()
    if concurrent_programs:
        with concurrent.futures.ThreadPoolExecutor(len(programs)) as pool:
            states = list(pool.map(lambda p: p[0].run(**p[1], backend=backend, **run_kw), programs))
    else:
        states = [prog.run(**kw, backend=backend, **run_kw) for prog, kw in programs]
    secs = time.perf_counter() - start
    for s in states:
        if s.error() is not None:
            raise RuntimeError(f"a benchmark program failed: {s.error()}")
    return secs, states


def part_dsl_vs_naive(ns: argparse.Namespace) -> list[str]:
    common = ["--dtype", ns.dtype]
    with_cache = ServerProcess(*common).wait_ready()
    without = ServerProcess(*common, "--disable-radix-cache").wait_ready()
    rows = []
    try:
        dsl = sgl.RuntimeEndpoint(with_cache.url)
        naive = NaiveHTTPBackend(without.url)
        kw = {"temperature": 0}
        warm = _programs("tree_of_thought", 1)
        run_programs(warm, dsl, True, **kw)  # warm-up both
        run_programs(warm, naive, False, pin_cache=False, **kw)
        for kind, label in (("tree_of_thought", "tree of thought (width 2, depth 2)"), ("self_critique", "self-critique (2 rounds)")):
            programs = _programs(kind, ns.programs)
            dsl_secs, _ = run_programs(programs, dsl, True, **kw)
            naive_secs, _ = run_programs(programs, naive, False, pin_cache=False, **kw)
            n = len(programs)
            rows.append(
                f"| {label}, {n} programs | {n / dsl_secs:.3f} | {n / naive_secs:.3f} | "
                f"**{naive_secs / dsl_secs:.2f}x** (target >= 3x) |"
            )
    finally:
        with_cache.stop()
        without.stop()
    return [
        "| workload | DSL, radix on, programs concurrent (programs/s) | naive sequential HTTP, radix off (programs/s) | ratio |",
        "|---|---|---|---|",
        *rows,
    ]


def part_pins(ns: argparse.Namespace) -> list[str]:
    server = ServerProcess("--dtype", ns.dtype, "--max-total-tokens", str(ns.pool_tokens)).wait_ready()
    backend = sgl.RuntimeEndpoint(server.url)
    ctx_words = 180

    @sgl.function
    def revisit(s, k: int, rounds: int):
        s += f"Private notes {k}: " + " ".join(f"note{k}-{i} holds." for i in range(ctx_words))
        for r in range(rounds):
            if r:
                s.sync()
                time.sleep(ns.tool_seconds)  # a tool call between the program's requests
            s += f"\nQuestion {r}: summarise." + sgl.gen(f"a{r}", max_tokens=8, ignore_eos=True)

    def noise(stop: threading.Event, seed: int) -> None:
        k = 0
        while not stop.is_set():
            text = f"Unrelated {seed}-{k}: " + " ".join(f"w{seed}x{k}x{i}" for i in range(ns.noise_words))
            backend.generate(text, {"max_new_tokens": 1})
            k += 1

    def run(pin: bool) -> tuple[float, float]:
        backend.flush_cache()
        stop = threading.Event()
        noisy = [threading.Thread(target=noise, args=(stop, s)) for s in range(2)]
        for t in noisy:
            t.start()
        try:
            start = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(ns.pin_programs) as pool:
                states = list(pool.map(
                    lambda k: revisit.run(k=k, rounds=ns.rounds, temperature=0, backend=backend, pin_cache=pin),
                    range(ns.pin_programs),
                ))
            secs = time.perf_counter() - start
        finally:
            stop.set()
            for t in noisy:
                t.join()
        metas = [s.get_meta_info(f"a{r}") for s in states for r in range(1, ns.rounds)]
        hit = sum(m["cached_tokens"] for m in metas) / sum(m["prompt_tokens"] for m in metas)
        return hit, ns.pin_programs / secs

    try:
        results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(ns.pin_repeats):  # alternate so drift hits both alike
            for pin in (False, True):
                results[pin].append(run(pin))
    finally:
        server.stop()

    def med(pin: bool, i: int) -> float:
        vals = sorted(r[i] for r in results[pin])
        return vals[len(vals) // 2]

    return [
        "| workload | side | result |",
        "|---|---|---|",
        f"| {ns.pin_programs} programs x {ns.rounds} calls ({ns.tool_seconds:g} s tool pause) on a "
        f"{ns.pool_tokens}-token pool, 2 noise clients | "
        f"pins off | hit rate {med(False, 0):.1%}, {med(False, 1):.3f} programs/s |",
        f"| same | pins on | hit rate {med(True, 0):.1%}, {med(True, 1):.3f} programs/s |",
        f"| ratio (programs/s) | | **{med(True, 1) / med(False, 1):.2f}x** |",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=["all", "dsl", "pins"], default="all")
    ap.add_argument("--programs", type=int, default=6, help="programs of each kind in part 1")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--pool-tokens", type=int, default=6000)
    ap.add_argument("--tool-seconds", type=float, default=3.0, help="pause between a program's calls")
    ap.add_argument("--noise-words", type=int, default=200, help="length of each noise prompt (~8 tokens per word)")
    ap.add_argument("--pin-programs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pin-repeats", type=int, default=2)
    ns = ap.parse_args()
    if ns.quick:
        ns.programs, ns.pin_programs, ns.rounds, ns.pin_repeats = 2, 2, 3, 1
    rows: list[str] = []
    if ns.part in ("all", "dsl"):
        rows += part_dsl_vs_naive(ns)
    if ns.part in ("all", "pins"):
        rows += ["", *part_pins(ns)]
    print("\n".join(rows))


if __name__ == "__main__":
    main()
