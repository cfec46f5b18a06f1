"""Routing policies for N replicas, simulated without a model (``bench_agent/routing_sim``).

    python -m bench_agent.bench_routing                      # N = 2..64, about two minutes
    python -m bench_agent.bench_routing --replicas 2 4 --workload critique

For each workload, N and policy: the share of prompt tokens served from the replicas'
caches, relative to one replica with all N pools and N times the speed (the cache that
routing cannot split), and the busiest replica's work over the mean. Policies: round
robin, power of two, the gateway's cache_aware with its own defaults, and cache_aware with
the balance thresholds ``forkserve serve --dp-size`` gives the gateway. Writes a markdown
table and a PNG plot.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench_agent.routing_sim.cluster import SimReplica, simulate
from bench_agent.routing_sim.policies import (
    CacheAware,
    CacheAwareConfig,
    Policy,
    PowerOfTwo,
    RoundRobin,
)
from bench_agent.routing_sim.trace import FastTokenizer, build_programs
from bench_agent.workloads import SIZES, get_workload
from runtime.server.data_parallel import GATEWAY_BALANCE

WORKLOADS = ("critique", "tree_of_thought", "multi_turn")
POLICIES = ("round_robin", "power_of_two", "cache_aware (gateway defaults)", "cache_aware (forkserve --dp-size)")


def make_policy(label: str, balance: tuple[int, float]) -> Policy:
    if label == "round_robin":
        return RoundRobin()
    if label == "power_of_two":
        return PowerOfTwo()
    if label == "cache_aware (gateway defaults)":
        return CacheAware(CacheAwareConfig())
    return CacheAware(CacheAwareConfig(balance_abs_threshold=int(balance[0]), balance_rel_threshold=balance[1]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench_agent.bench_routing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = " (default: %(default)s)"
    p.add_argument("--workload", action="append", choices=WORKLOADS, help="repeat for several (default: all three)")
    p.add_argument("--size", choices=SIZES, default="full", help="workload size preset" + d)
    p.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64], help="values of N" + d)
    p.add_argument("--programs-per-replica", type=int, default=16, help="programs run in all, per replica" + d)
    p.add_argument("--concurrency-per-replica", type=int, default=4, help="programs in flight, per replica" + d)
    p.add_argument("--pool-tokens", type=int, default=16_384, help="KV slots of each replica" + d)
    p.add_argument("--decode-weight", type=float, default=4.0,
                   help="work of an answer token, in prompt tokens computed (decode is sequential)" + d)
    p.add_argument("--balance", type=float, nargs=2, metavar=("ABS", "REL"), default=list(GATEWAY_BALANCE),
                   help="cache_aware's --balance-abs-threshold and --balance-rel-threshold for the "
                   "'forkserve --dp-size' rows (default: the values forkserve passes to the gateway)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workloads' text" + d)
    p.add_argument("--output-dir", default="bench_results", help="where routing.md and routing.png go" + d)
    return p.parse_args(argv)


def run(ns: argparse.Namespace) -> list[dict[str, Any]]:
    from runtime.model_loader import resolve_model_path

    tokenizer = FastTokenizer(resolve_model_path(None))
    rows = []
    for name in ns.workload or WORKLOADS:
        started = time.perf_counter()
        programs = build_programs(get_workload(name), ns.programs_per_replica * max(ns.replicas), ns.size, ns.seed,
                                  tokenizer)
        print(f"{name}: {len(programs)} programs traced in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        for n in ns.replicas:
            subset = programs[: ns.programs_per_replica * n]
            concurrency = ns.concurrency_per_replica * n
            single = simulate(subset, RoundRobin(), [SimReplica(ns.pool_tokens * n, speed=n)], concurrency,
                              ns.decode_weight)
            for label in POLICIES:
                policy = make_policy(label, tuple(ns.balance))
                r = simulate(subset, policy, [SimReplica(ns.pool_tokens) for _ in range(n)], concurrency,
                             ns.decode_weight)
                rows.append({"workload": name, "replicas": n, "policy": label, "hit_rate": r.hit_rate,
                             "single_hit_rate": single.hit_rate, "relative_hit_rate": r.hit_rate / single.hit_rate,
                             "max_over_mean_load": r.max_over_mean_load, "not_cached_calls": r.not_cached,
                             "speed_vs_single": single.elapsed / r.elapsed})
            print(f"  N={n} done", file=sys.stderr)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | N | policy | hit rate | of one replica's | busiest / mean load | time of one replica / this |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['replicas']} | {r['policy']} | {r['hit_rate']:.1%} "
                     f"| {r['relative_hit_rate']:.0%} | {r['max_over_mean_load']:.2f} | {r['speed_vs_single']:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(2, len(workloads), figsize=(4.2 * len(workloads), 7), squeeze=False)
    for col, name in enumerate(workloads):
        for label in POLICIES:
            mine = [r for r in rows if r["workload"] == name and r["policy"] == label]
            xs = [r["replicas"] for r in mine]
            axes[0][col].plot(xs, [r["relative_hit_rate"] for r in mine], marker="o", label=label)
            axes[1][col].plot(xs, [r["max_over_mean_load"] for r in mine], marker="o", label=label)
        axes[0][col].set_title(name)
        axes[0][col].axhline(0.9, color="grey", lw=0.8, ls="--")
        axes[1][col].axhline(1.3, color="grey", lw=0.8, ls="--")
        axes[1][col].set_yscale("log")
        for row in (0, 1):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].set_xlabel("replicas")
            axes[row][col].grid(alpha=0.3)
    axes[0][0].set_ylabel("cache hit rate / one replica's")
    axes[1][0].set_ylabel("busiest replica's load / mean")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Routing N replicas (simulated; python -m bench_agent.bench_routing)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    rows = run(ns)
    table = markdown(rows)
    print(table)
    out = Path(ns.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "routing.md").write_text(table + "\n")
    plot(rows, out / "routing.png")
    print(f"\nwrote {out / 'routing.md'} and {out / 'routing.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
