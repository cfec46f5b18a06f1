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
import sys

from bench_agent.compare import add_compare_args, check_compare_args, run_compared
from bench_agent.drivers import DRIVERS
from bench_agent.measure import WarmupFailed, finish, measure, open_driver, selected_workloads
from bench_agent.workloads import ALIASES, NAMES, SIZES
from frontend_lang.backend.base import BackendError
from runtime.cli_types import positive_float, positive_int


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
                   help="Workload to run; repeat for several, or 'all' (default: critique). "
                   + ", ".join(f"{a} is {n}" for a, n in ALIASES.items()) + ".")
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
    p.add_argument("--size", choices=SIZES, default="quick", help="Workload size preset: tiny (a few programs of tens of tokens, to check that "
                   "everything runs; seconds), quick (agent-sized prompts of about a thousand tokens, short "
                   "answers; minutes on 2 cores) or full (longer prompts and answers, more rounds "
                   "and programs). Each workload's sizes are in bench_agent/workloads/" + d)
    p.add_argument("--num-programs", type=positive_int, help="Programs per workload (default: the workload's number "
                   "for --size).")
    p.add_argument("--concurrency", type=positive_int, help="Programs in flight at once (default: 8; 1 for hf, "
                   "which runs one request at a time anyway).")
    p.add_argument("--request-rate", type=positive_float, help="Programs per second, arriving as a Poisson process; "
                   "--concurrency then caps programs in flight (default: none, a closed loop: each program "
                   "starts as soon as one of --concurrency ends).")
    p.add_argument("--seed", type=int, default=0, help="Seed of the synthetic text and arrivals" + d)
    p.add_argument("--label", help="Backend name in the table (default: the driver and its flags).")
    p.add_argument("--no-warmup", action="store_true", help="Skip the one small unmeasured program per workload.")
    p.add_argument("--no-flush", action="store_true", help="Keep the server's prefix cache between workloads "
                   "(by default it is emptied after the warm-up, before each workload: /flush_cache on "
                   "forkserve and SGLang, /reset_prefix_cache on vLLM started with VLLM_SERVER_DEV_MODE=1; "
                   "a server with neither is named on stderr).")
    p.add_argument("--output-dir", default="bench_results", help="Where results.jsonl, table.md and "
                   "bench.png go" + d)
    p.add_argument("--no-plot", action="store_true", help="Do not draw bench.png.")
    p.add_argument("--no-progress", action="store_true", help="No progress bars.")
    add_compare_args(p)


def check_flags_apply(ns: argparse.Namespace) -> None:
    """``ValueError`` for a flag the run would ignore: a run measured without what was asked
    for reads as a measurement of it."""
    if ns.suite:
        given = [flag for flag, used in (
            ("--workload", ns.workload), ("--url", ns.url), ("--backend", ns.backend != "dsl"),
            ("--in-process", ns.in_process), ("--server-args", ns.server_args), ("--num-programs", ns.num_programs),
            ("--concurrency", ns.concurrency), ("--request-rate", ns.request_rate), ("--label", ns.label),
            ("--api-key", ns.api_key), ("--size", ns.size != "quick"),
            ("--model", ns.model)) if used]  # (its servers run the default model: transformers must too)
        if given:
            raise ValueError(f"--suite quick runs its own workloads, sizes and backends (two local servers and "
                             f"transformers); {', '.join(given)} do not apply to it")
        return
    if ns.backend == "hf" and (ns.url or ns.in_process):
        raise ValueError("--backend hf runs transformers in this process; --url and --in-process do not apply")
    if ns.in_process and ns.backend != "dsl":
        raise ValueError("--in-process applies to --backend dsl only")
    if ns.in_process and ns.url:
        raise ValueError("--in-process loads the model in this process; --url names a server: give one of them")
    if ns.backend == "dsl" and ns.model is not None:  # else the default model would be measured under its name
        raise ValueError("--model applies to --backend openai (the model to request) and hf (a model path); the "
                         "dsl backend's local server or engine takes its model in --server-args, e.g. "
                         "--server-args=\"--model-path PATH\"")
    if ns.backend == "hf" and ns.server_args:
        raise ValueError("--server-args are forkserve's flags; --backend hf runs transformers (its model is --model, "
                         "its dtype --dtype)")
    if ns.url and ns.server_args:
        raise ValueError("--server-args are the flags of the local server or in-process engine bench starts; "
                         "the server at --url runs with its own: start it with them instead")
    if ns.dtype != "auto" and ns.backend != "hf":
        raise ValueError("--dtype is transformers' (--backend hf); forkserve's local server or engine takes "
                         "it in --server-args, e.g. --server-args=\"--dtype float32\"")


def run_bench_command(ns: argparse.Namespace) -> int:
    try:
        check_flags_apply(ns)
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


def _run_single(ns: argparse.Namespace) -> int:
    concurrency = ns.concurrency or (1 if ns.backend == "hf" else 8)
    rows, failed = [], 0
    with open_driver(ns) as (backend, probe, label):
        for w in selected_workloads(ns):
            try:
                rows.append(measure(w, backend, ns, ns.backend, label, probe, ns.num_programs, concurrency))
            except WarmupFailed as err:  # the others may still run (transformers cannot run react's tools)
                print(f"forkserve bench: {err}", file=sys.stderr)
                failed += 1
    if not rows:
        return 1
    return max(finish(rows, ns, title=f"forkserve bench ({ns.size})"), int(failed > 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench_agent.cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_args(parser)
    return run_bench_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
