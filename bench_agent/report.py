"""Results out: a markdown table, JSON lines, and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One line per run: ``rows`` hold ``workload``, ``backend`` and ``summarise``'s keys."""
    head = (
        "| workload | backend | programs | programs/s | output tok/s | cache hit | TTFT p50 / p99 (ms) "
        "| ITL p50 / p99 (ms) | call e2e p50 (s) | program p50 (s) | peak KV | errors |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        hit = "n/a" if r["cache_hit_rate"] is None else f"{r['cache_hit_rate']:.1%}"
        kv = "n/a" if r["peak_kv_usage"] is None else f"{r['peak_kv_usage']:.1%}"
        lines.append(
            f"| {r['workload']} | {r['backend']} | {r['programs']} | {r['programs_per_s']:.3f} "
            f"| {r['output_tok_per_s']:.1f} | {hit} | {_fmt(r['ttft_ms_p50'], '.0f')} / {_fmt(r['ttft_ms_p99'], '.0f')} "
            f"| {_fmt(r['itl_ms_p50'], '.0f')} / {_fmt(r['itl_ms_p99'], '.0f')} | {_fmt(r['e2e_s_p50'], '.2f')} "
            f"| {_fmt(r['program_s_p50'], '.2f')} | {kv} | {r['errors']} |"
        )
    return "\n".join(lines)


def append_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def plot(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> None:
    """Two panels, grouped by workload with one bar per backend: programs/s (log scale, the
    baselines differ by an order of magnitude) and the median program latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    by_key = {(r["workload"], r["backend"]): r for r in rows}
    width = 0.8 / max(1, len(backends))
    fig, axes = plt.subplots(1, 2, figsize=(6 + 1.6 * len(workloads), 4.5))
    panels = (("programs_per_s", "programs/s (log)", True), ("program_s_p50", "program latency p50 (s)", False))
    for ax, (key, label, log) in zip(axes, panels, strict=True):
        for j, backend in enumerate(backends):
            xs = [i + (j - (len(backends) - 1) / 2) * width for i in range(len(workloads))]
            ys = [(by_key.get((w, backend)) or {}).get(key) or 0.0 for w in workloads]
            ax.bar(xs, ys, width, label=backend)
        ax.set_xticks(range(len(workloads)), workloads, rotation=20)
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
