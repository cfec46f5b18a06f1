"""``forkserve bench --suite quick``: the main comparisons in one run, under 10 minutes on
2 CPU cores with the default model.

Three sides, measured in the same run so that machine drift hits them alike:
  - forkserve with the radix cache (DSL driver over HTTP, programs concurrent);
  - the same server build with ``--disable-radix-cache`` (same driver, same concurrency);
  - transformers in-process, one request at a time (the raw baseline; fewer programs,
    since it is slow and its rate does not depend on how many run).
Both servers are up side by side; each idles while another side is measured.

Workloads: critique and tree of thought (the targets: radix on >= 2x radix off and >= 10x
transformers in programs/s), and the no-reuse control (radix on within 5% of radix off:
on/off >= 0.95),
whose two forkserve sides are measured twice in the order on, off, off, on and averaged,
since a 5% margin is within one run's noise here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench_agent.drivers import kv_probe_for_url
from bench_agent.measure import finish, measure
from bench_agent.workloads import get_workload
from frontend_lang.backend.runtime_endpoint import RuntimeEndpoint
from runtime.server.server_process import ServerProcess

# workload -> (programs on forkserve, programs in flight, programs on transformers)
QUICK = {
    "critique": (16, 16, 2),
    "tree_of_thought": (16, 16, 1),
    "no_reuse": (32, 16, 6),
}
CONTROL = "no_reuse"
ON, OFF, HF = "forkserve, radix on", "forkserve, radix off", "transformers, one at a time"


def run_quick_suite(ns: argparse.Namespace) -> int:
    from bench_agent.drivers.hf import HFBackend

    ns.size = "quick"
    dtype = ["--dtype", ns.dtype]
    print("starting two local forkserve servers (radix cache on and off)", file=sys.stderr)
    servers = {ON: ServerProcess(*dtype), OFF: ServerProcess(*dtype, "--disable-radix-cache")}
    rows: list[dict[str, Any]] = []
    try:
        sides: dict[str, Any] = {}
        for label, server in servers.items():
            server.wait_ready()
            sides[label] = (RuntimeEndpoint(server.url), kv_probe_for_url(server.url), "dsl")
        sides[HF] = (HFBackend(ns.model, ns.dtype), None, "hf")
        for name, (programs, concurrency, hf_programs) in QUICK.items():
            workload = get_workload(name)
            order = [ON, OFF, OFF, ON, HF] if name == CONTROL else [ON, OFF, HF]
            runs = []
            for label in order:
                backend, probe, driver = sides[label]
                n, c = (hf_programs, 1) if label == HF else (programs, concurrency)
                runs.append(measure(workload, backend, ns, driver, label, probe, n, c))
            rows += [_average([r for r in runs if r["backend"] == label]) for label in dict.fromkeys(order)]
    finally:
        for server in servers.values():
            server.stop()
    return finish(rows, ns, "forkserve bench --suite quick", extra_markdown=targets_table(rows))


def _average(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated runs of the same side: throughputs averaged, the rest from
    the first run, and ``repeats`` says how many went in."""
    row = dict(runs[0])
    for key in ("programs_per_s", "output_tok_per_s"):
        row[key] = sum(r[key] for r in runs) / len(runs)
    row["errors"] = sum(r["errors"] for r in runs)
    row["repeats"] = len(runs)
    return row


def targets_table(rows: list[dict[str, Any]]) -> str:
    rate = {(r["workload"], r["backend"]): r["programs_per_s"] for r in rows}
    lines = ["| workload | radix on / radix off | radix on / transformers | target | met |", "|---|---|---|---|---|"]
    for name in QUICK:
        on, off, hf = (rate.get((name, side), 0.0) for side in (ON, OFF, HF))
        if name == CONTROL:  # the cache must cost nothing when it cannot help
            target, met = "on/off >= 0.95", off > 0 and on / off >= 0.95
        else:
            target, met = "on/off >= 2, on/transformers >= 10", off > 0 and hf > 0 and on / off >= 2 and on / hf >= 10
        lines.append(f"| {name} | {_ratio(on, off)} | {_ratio(on, hf)} | {target} | {'yes' if met else 'no'} |")
    return "\n".join(lines)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"
