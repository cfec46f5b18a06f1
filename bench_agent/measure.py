"""One measured run of ``forkserve bench``: open the driver for a target (a local or remote
server, the in-process engine, transformers), run a workload on it and summarise it
(``measure``), then print and write the results (``finish``). Used by the single-target
command (``cli.py``), ``--compare`` (``compare.py``) and ``--suite quick`` (``suite.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import platform
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_agent.drivers import KVProbe, flush_cache, kv_probe_for_engine, kv_probe_for_url
from bench_agent.metrics import summarise
from bench_agent.report import append_jsonl, markdown_table, plot
from bench_agent.runner import run_workload
from bench_agent.workloads import NAMES, Workload, get_workload
from frontend_lang.backend.base import Backend, BackendError

WARMUP_SEED_OFFSET = 1_000_003  # warm-up programs share no text with measured ones


def selected_workloads(ns: argparse.Namespace) -> list[Workload]:
    """The workloads ``--workload`` names (default: critique; ``all``: every one)."""
    names = ns.workload or ["critique"]
    return [get_workload(n) for n in (NAMES if "all" in names else dict.fromkeys(names))]


@contextlib.contextmanager
def open_driver(ns: argparse.Namespace) -> Iterator[tuple[Backend, KVProbe | None, str]]:
    """The backend for ``ns.backend``, a KV probe if the target shows its usage, a label."""
    label = ns.label
    if ns.backend == "hf":
        from bench_agent.drivers.hf import HFBackend

        hf = HFBackend(ns.model, ns.dtype)
        yield hf, None, label or f"transformers one at a time ({hf.dtype})"
        return
    if ns.backend == "dsl" and ns.in_process:
        from frontend_lang.backend.engine import EngineBackend

        engine_backend = EngineBackend(**engine_kwargs(ns.server_args))
        try:
            yield engine_backend, kv_probe_for_engine(engine_backend), label or _label("dsl in-process", ns.server_args)
        finally:
            engine_backend.shutdown()
        return
    server = None
    url = ns.url
    if url is None:
        from runtime.server.server_process import ServerProcess

        print(f"starting a local forkserve server {ns.server_args}".rstrip(), file=sys.stderr)
        server = ServerProcess(*shlex.split(ns.server_args)).wait_ready()
        url = server.url
    try:
        backend = _http_backend(ns.backend, url, ns.model, ns.api_key)
        where = "local forkserve" if server else url
        try:
            yield backend, kv_probe_for_url(url, ns.api_key), label or _label(f"{ns.backend} @ {where}", ns.server_args if server else "")
        finally:
            backend.shutdown()
    finally:
        if server is not None:
            server.stop()


def _http_backend(driver: str, url: str, model: str | None, api_key: str | None) -> Backend:
    if driver == "openai":
        from bench_agent.drivers.openai_chat import OpenAIChatBackend

        return OpenAIChatBackend(url, model, api_key)
    from frontend_lang.backend.runtime_endpoint import RuntimeEndpoint

    return RuntimeEndpoint(url, api_key)


def _label(base: str, flags: str) -> str:
    return f"{base} {flags}".strip()


def engine_kwargs(flags: str) -> dict[str, Any]:
    """Engine keyword arguments from server-style flags (one parser for both)."""
    from runtime.arg_fields import add_cli_args, args_from_namespace
    from runtime.config import ServerArgs

    parser = argparse.ArgumentParser(prog="--server-args", add_help=False)
    add_cli_args(parser, ServerArgs)
    args = args_from_namespace(parser.parse_args(shlex.split(flags)), ServerArgs)
    return dict(vars(args))


class WarmupFailed(BackendError):
    """A workload's warm-up program failed: its measured ones would too. A single run skips
    that workload; --compare and --suite stop there (their ratios need both sides)."""


def measure(
    workload: Workload,
    backend: Backend,
    ns: argparse.Namespace,
    driver: str,
    label: str,
    probe: KVProbe | None,
    num_programs: int | None,
    concurrency: int,
) -> dict[str, Any]:
    """Warm up, flush the cache, run the workload once, and return its summary row."""
    if not ns.no_warmup:
        warm = workload.program_args(1, ns.seed + WARMUP_SEED_OFFSET, "tiny")
        warmed = run_workload(workload, backend, warm, concurrency=1, progress=False)
        if warmed.errors:  # the measured programs would fail alike (a wrong --model, a server that refuses)
            raise WarmupFailed(f"{workload.name} / {label}: the warm-up program failed, so it was not measured: "
                               f"{warmed.errors[0]}")
    if not ns.no_flush and flush_cache(backend) is False:
        print(f"  {workload.name} / {label}: could not empty the server's prefix cache (it has no /flush_cache, "
              "nor /reset_prefix_cache as vLLM has with VLLM_SERVER_DEV_MODE=1): what earlier runs sent it "
              "stays cached", file=sys.stderr)
    n = num_programs or workload.default_programs[ns.size]
    result = run_workload(
        workload,
        backend,
        workload.program_args(n, ns.seed, ns.size),
        concurrency=concurrency,
        request_rate=ns.request_rate,
        seed=ns.seed,
        kv_probe=probe,
        progress=not ns.no_progress,
        desc=f"{workload.name} / {label}",
    )
    for err in result.errors:
        print(f"  {workload.name} / {label}: {err}", file=sys.stderr)
    summary = summarise(result)
    print(f"  {workload.name} / {label}: {n} programs in {result.wall_s:.1f} s, "
          f"{summary['programs_per_s']:.3f} programs/s", file=sys.stderr)
    if summary["short_calls"] and workload.fixed_lengths:
        print(f"  {workload.name} / {label}: {summary['short_calls']} calls stopped before their fixed "
              "length (does the server honour ignore_eos?); the sides did different work", file=sys.stderr)
    return {
        "workload": workload.name,
        "backend": label,
        "driver": driver,
        "size": ns.size,
        "concurrency": concurrency,
        "request_rate": ns.request_rate,
        "seed": ns.seed,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {_cpu_count()} CPUs",
        **summary,
    }


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


def finish(rows: list[dict[str, Any]], ns: argparse.Namespace, title: str, extra_markdown: str = "") -> int:
    """Print the table; write results.jsonl (appended), table.md and bench.png."""
    out = Path(ns.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(rows) + (f"\n\n{extra_markdown}" if extra_markdown else "")
    print(table)
    append_jsonl(out / "results.jsonl", rows)
    (out / "table.md").write_text(table + "\n")
    if not ns.no_plot:
        plot(rows, out / "bench.png", title)
    written = ", ".join(str(out / f) for f in ("results.jsonl", "table.md", *(() if ns.no_plot else ("bench.png",))))
    print(f"\nwrote {written}", file=sys.stderr)
    return 1 if any(r["errors"] for r in rows) else 0
