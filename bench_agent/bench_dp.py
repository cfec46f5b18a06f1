"""Why cache-aware routing matters, measured: the agent workloads on ``forkserve serve
--dp-size 2`` behind SGLang's model gateway with ``cache_aware`` and with ``round_robin``,
and on one server with all the cores, in one run.

    python -m bench_agent.bench_dp                 # quick sizes; run it on a quiet machine
    python -m bench_agent.bench_dp --size tiny     # a smoke check (a few minutes)

One server setup at a time (each started, measured on every workload, then stopped), with
the same memory and cores for each: two replicas share --num-threads and the KV pool
(``--server-args``) that the single server has alone. Programs go through the OpenAI chat
API (the gateway routes a chat by its messages' text); the gateway's /flush_cache empties
every replica's cache between workloads. Printed: the usual table (cache hit rate,
programs/s, latencies) and the ratios cache_aware / round_robin and two replicas with
cache_aware / one server. Needs the router extra: pip install -e '.[router]'.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

import httpx

from bench_agent.drivers.openai_chat import OpenAIChatBackend
from bench_agent.measure import finish, measure
from bench_agent.workloads import SIZES, get_workload
from runtime.server.server_process import ServerProcess

WORKLOADS = ("critique", "tree_of_thought", "multi_turn")
CACHE_AWARE, ROUND_ROBIN, SINGLE = "2 replicas, cache_aware", "2 replicas, round_robin", "1 server, all cores"
SIDES = {
    CACHE_AWARE: ("--dp-size", "2", "--router-policy", "cache_aware"),
    ROUND_ROBIN: ("--dp-size", "2", "--router-policy", "round_robin"),
    SINGLE: (),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench_agent.bench_dp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = " (default: %(default)s)"
    p.add_argument("--size", choices=SIZES, default="quick", help="workload size preset" + d)
    p.add_argument("--workload", action="append", choices=WORKLOADS, help="repeat for several (default: all three)")
    p.add_argument("--num-programs", type=int, help="programs per workload (default: the workload's for --size)")
    p.add_argument("--concurrency", type=int, default=8, help="programs in flight" + d)
    p.add_argument("--server-args", default="", help="flags for every server setup (the replicas split "
                   "--num-threads and the KV pool), e.g. --server-args=\"--kv-cache-memory 2\"")
    p.add_argument("--seed", type=int, default=0, help="seed of the workloads' text" + d)
    p.add_argument("--output-dir", default="bench_results", help="where results.jsonl, table.md and bench.png go" + d)
    p.add_argument("--no-plot", action="store_true", help="do not draw bench.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    ns = p.parse_args(argv)
    # what bench_agent.measure reads
    ns.no_warmup, ns.no_flush, ns.request_rate = False, True, None
    return ns


def run_side(label: str, flags: tuple[str, ...], ns: argparse.Namespace) -> list[dict[str, Any]]:
    print(f"starting {label}: forkserve serve {' '.join(flags)} {ns.server_args}".rstrip(), file=sys.stderr)
    server = ServerProcess(*flags, *shlex.split(ns.server_args))
    try:
        server.wait_ready(timeout=600)
    except (RuntimeError, TimeoutError):
        print(server.read_output()[-4000:], file=sys.stderr)
        server.stop(timeout=60)
        raise
    rows = []
    try:
        backend = OpenAIChatBackend(server.url)
        try:
            for name in ns.workload or WORKLOADS:
                httpx.post(server.url + "/flush_cache", timeout=60)  # every replica's cache, through the gateway
                rows.append(measure(get_workload(name), backend, ns, "openai", label, None, ns.num_programs,
                                    ns.concurrency))
        finally:
            backend.shutdown()
    finally:
        server.stop(timeout=60)
    return rows


def ratios(rows: list[dict[str, Any]]) -> str:
    by = {(r["workload"], r["backend"]): r for r in rows}
    lines = ["| workload | hit rate: cache_aware / round_robin | programs/s: cache_aware / round_robin "
             "| programs/s: 2 replicas cache_aware / 1 server |", "|---|---|---|---|"]
    for name in dict.fromkeys(r["workload"] for r in rows):
        ca, rr, one = (by.get((name, side)) for side in (CACHE_AWARE, ROUND_ROBIN, SINGLE))
        lines.append(f"| {name} | {_ratio(ca, rr, 'cache_hit_rate')} | {_ratio(ca, rr, 'programs_per_s')} "
                     f"| {_ratio(ca, one, 'programs_per_s')} |")
    return "\n".join(lines)


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> str:
    if not a or not b or not a.get(key) or not b.get(key):
        return "n/a"
    return f"{a[key] / b[key]:.2f}x"


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    rows: list[dict[str, Any]] = []
    for label, flags in SIDES.items():
        rows += run_side(label, flags, ns)
    return finish(rows, ns, f"forkserve --dp-size 2 behind SGLang's gateway ({ns.size})", extra_markdown=ratios(rows))


if __name__ == "__main__":
    sys.exit(main())
