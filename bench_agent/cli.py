"""``forkserve bench``: agent workloads against forkserve, any OpenAI-compatible server, or
transformers in-process; a markdown table on stdout, JSON lines and a PNG plot on disk.

    forkserve bench --workload critique                          # DSL on a local forkserve server
    forkserve bench --workload tot --backend openai --url http://127.0.0.1:8000   # e.g. vLLM
    forkserve bench --workload critique --backend hf            # transformers, one at a time
    forkserve bench --suite quick                                # the main comparisons
    forkserve bench --backend openai --workload critique --compare URL --compare-cmd CMD   # vs another server
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

from bench_agent.compare import add_compare_args, check_compare_args, run_compared
from bench_agent.drivers import DRIVERS, KVProbe, flush_cache, kv_probe_for_engine, kv_probe_for_url
from bench_agent.metrics import summarise
from bench_agent.report import append_jsonl, markdown_table, plot
from bench_agent.runner import run_workload
from bench_agent.workloads import ALIASES, NAMES, SIZES, Workload, get_workload
from frontend_lang.backend.base import Backend, BackendError

WARMUP_SEED_OFFSET = 1_000_003  # warm-up programs share no text with measured ones


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="Benchmark agent workloads on forkserve, any OpenAI-compatible server, or transformers.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_bench_args(p)
    p.set_defaults(func=run_bench_command)


def add_bench_args(p: argparse.ArgumentParser) -> None:
    d = " (default: %(default)s)"
    p.add_argument("--suite", choices=["quick"], help="Run a preset comparison instead of one backend: "
                   "'quick' runs critique, tree_of_thought and no_reuse on forkserve with the radix cache on "
                   "and off and on transformers one at a time (under 10 minutes on 2 CPU cores).")
    p.add_argument("--workload", action="append", choices=[*NAMES, *ALIASES, "all"],
                   help="Workload to run; repeat for several, or 'all' (default: critique).")
    p.add_argument("--backend", choices=DRIVERS, default="dsl", help="dsl: forkserve's DSL over the native API "
                   "(or in-process); openai: chat completions on any OpenAI-compatible server; hf: transformers "
                   "in-process, one request at a time" + d)
    p.add_argument("--url", help="Server to measure (dsl, openai). Without it a local forkserve server is "
                   "started with --server-args and stopped afterwards.")
    p.add_argument("--server-args", default="", help="Flags for the local forkserve server or the in-process "
                   "engine; write it with = when it starts with a dash: --server-args=\"--disable-radix-cache --dtype float32\".")
    p.add_argument("--in-process", action="store_true", help="dsl: run the engine in this process, no server.")
    p.add_argument("--model", help="openai: model name to request (default: the server's first /v1/models "
                   "entry); hf: model path (default: the default model).")
    p.add_argument("--api-key", help="Bearer token for --url.")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="hf: model dtype "
                   "(auto picks what forkserve picks on this CPU)" + d)
    p.add_argument("--size", choices=SIZES, default="quick", help="Workload size preset" + d)
    p.add_argument("--num-programs", type=_positive_int, help="Programs per workload (default: the workload's number "
                   "for --size).")
    p.add_argument("--concurrency", type=_positive_int, help="Programs in flight at once (default: 8; 1 for hf, "
                   "which runs one request at a time anyway).")
    p.add_argument("--request-rate", type=float, help="Programs per second, arriving as a Poisson process; "
                   "--concurrency then caps programs in flight.")
    p.add_argument("--seed", type=int, default=0, help="Seed of the synthetic text and arrivals" + d)
    p.add_argument("--label", help="Backend name in the table (default: the driver and its flags).")
    p.add_argument("--no-warmup", action="store_true", help="Skip the one small unmeasured program per workload.")
    p.add_argument("--no-flush", action="store_true", help="Keep the server's prefix cache between workloads "
                   "(by default a forkserve server's cache is flushed before each).")
    p.add_argument("--output-dir", default="bench_results", help="Where results.jsonl, table.md and "
                   "bench.png go" + d)
    p.add_argument("--no-plot", action="store_true", help="Do not draw bench.png.")
    p.add_argument("--no-progress", action="store_true", help="No progress bars.")
    add_compare_args(p)


def run_bench_command(ns: argparse.Namespace) -> int:
    try:
        check_compare_args(ns)
        if ns.compare:
            return run_compared(ns)
        if ns.suite == "quick":
            from bench_agent.suite import run_quick_suite

            return run_quick_suite(ns)
        return _run_single(ns)
    except (BackendError, ValueError, RuntimeError, TimeoutError) as err:
        print(f"forkserve bench: {err}", file=sys.stderr)
        return 1


def _workloads(ns: argparse.Namespace) -> list[Workload]:
    names = ns.workload or ["critique"]
    return [get_workload(n) for n in (NAMES if "all" in names else dict.fromkeys(names))]


def _run_single(ns: argparse.Namespace) -> int:
    if ns.backend == "hf" and (ns.url or ns.in_process):
        raise ValueError("--backend hf runs transformers in this process; --url and --in-process do not apply")
    if ns.in_process and ns.backend != "dsl":
        raise ValueError("--in-process applies to --backend dsl only")
    concurrency = ns.concurrency or (1 if ns.backend == "hf" else 8)
    with open_driver(ns) as (backend, probe, label):
        rows = [
            measure(w, backend, ns, ns.backend, label, probe, ns.num_programs, concurrency)
            for w in _workloads(ns)
        ]
    return finish(rows, ns, title=f"forkserve bench ({ns.size})")


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
        from bench_agent.local_server import ServerProcess

        print(f"starting a local forkserve server {ns.server_args}".rstrip(), file=sys.stderr)
        server = ServerProcess(*shlex.split(ns.server_args)).wait_ready()
        url = server.url
    try:
        backend = _http_backend(ns.backend, url, ns.model, ns.api_key)
        where = "local forkserve" if server else url
        try:
            yield backend, kv_probe_for_url(url), label or _label(f"{ns.backend} @ {where}", ns.server_args if server else "")
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
    from runtime.config import ServerArgs, add_cli_args, args_from_namespace

    parser = argparse.ArgumentParser(prog="--server-args", add_help=False)
    add_cli_args(parser, ServerArgs)
    args = args_from_namespace(parser.parse_args(shlex.split(flags)), ServerArgs)
    return dict(vars(args))


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
        run_workload(workload, backend, warm, concurrency=1, progress=False)
    if not ns.no_flush:
        flush_cache(backend)
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
    if summary["short_calls"]:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench_agent.cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_args(parser)
    return run_bench_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
