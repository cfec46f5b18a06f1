"""What ``forkserve serve --dp-size N`` starts, decided before anything starts: each
replica's flags (its share of the CPU threads and of the KV pool, a port on 127.0.0.1) and
the gateway's command line. ``dp_launcher.py`` runs the plan.

A replica is a whole ``forkserve serve`` (HTTP, scheduler and detokenizer processes), so a
replica behaves exactly like a single server and the gateway needs nothing but SGLang's
HTTP API from it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shlex
from dataclasses import dataclass

from runtime.arg_fields import cli_flags
from runtime.capacity import (
    available_memory_bytes,
    kv_bytes_per_token,
    model_config,
    packs_on_cpu,
    weight_bytes,
)
from runtime.config import MIN_KV_TOKENS, ServerArgs
from runtime.executor.compute_threads import available_cores
from runtime.serve_args import DataParallelArgs, HttpArgs
from runtime.server.orphan_guard import guarded_command

GATEWAY_MODULE = "sglang_router.launch_router"
INSTALL_HINT = "pip install sglang-router (from a checkout: pip install -e '.[router]')"
REPLICA_HOST = "127.0.0.1"
# The gateway waits this long for in-flight requests when stopped (its own default is 180 s,
# too long for a Ctrl-C); the replicas, stopped at the same time, answer theirs within it.
GATEWAY_GRACE_S = 5
# cache_aware's balance thresholds (--balance-abs-threshold, --balance-rel-threshold): the
# gateway sends a request to the least busy replica, whatever it caches, when the busiest
# has more than 4 requests more in flight than the least busy one and over 6 times as many.
# With its own defaults (64, 1.5) that never happens with a few programs per replica, so
# programs that share a long system prompt all went to the replica that first saw it; a
# low relative threshold instead split a fork's branches over replicas that lack their
# prefix. Chosen with python -m bench_agent.bench_routing (docs/scale.md).
GATEWAY_BALANCE = (4, 6.0)
# The gateway checks each replica's /health_generate, which puts a token through the
# scheduler (or sees it step while busy): /health only says the processes are up, and a
# replica whose scheduler hung stayed healthy while requests routed to it hung. That probe
# answers within 20 s (``probe_generate``), so the gateway's own timeout (5 s by default,
# which a long prefill step on a busy CPU can exceed) is set above it.
HEALTH_CHECK_ENDPOINT = "/health_generate"
HEALTH_CHECK_TIMEOUT_S = 25


class PlanError(ValueError):
    pass


@dataclass(frozen=True)
class Replica:
    index: int
    args: ServerArgs
    http: HttpArgs

    @property
    def url(self) -> str:
        return f"http://{self.http.host}:{self.http.port}"

    def command(self, parent_pid: int) -> list[str]:
        return [*guarded_command("runtime.cli", parent_pid), "serve", *cli_flags(self.http), *cli_flags(self.args)]


def gateway_installed() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


def plan_replicas(args: ServerArgs, http: HttpArgs, dp: DataParallelArgs, ports: list[int]) -> list[Replica]:
    """``dp.dp_size`` replicas sharing the threads and the KV pool that one server with
    ``args`` would have had: the same memory and cores, spread over several schedulers."""
    n = dp.dp_size
    if len(ports) != n:
        raise PlanError(f"need {n} ports, got {len(ports)}")
    shares: dict[str, object] = {}
    if args.max_total_tokens is not None:
        tokens = args.max_total_tokens // n
        if tokens < MIN_KV_TOKENS:
            raise PlanError(f"--max-total-tokens {args.max_total_tokens} split over {n} replicas leaves {tokens} "
                            f"tokens each; each needs at least {MIN_KV_TOKENS}")
        shares["max_total_tokens"] = tokens
    else:
        shares["kv_cache_memory"] = args.kv_cache_memory / n
    _check_memory(args, n)
    threads = thread_shares(args.num_threads or available_cores(), n)
    return [Replica(i, dataclasses.replace(args, num_threads=threads[i], **shares),  # type: ignore[arg-type]
                    dataclasses.replace(http, host=REPLICA_HOST, port=port))
            for i, port in enumerate(ports)]


def _check_memory(args: ServerArgs, n: int) -> None:
    """On a CPU, the replicas' KV pools and their ``n`` copies of the weights must fit in the
    memory available now: they all start at once, and each checks only its own pool."""
    available = available_memory_bytes() if args.resolved_device.startswith("cpu") else None
    if available is None:
        return
    _, cfg = model_config(args.model_path)
    weights = weight_bytes(cfg, args.resolved_dtype, packs_on_cpu(args))
    pool = (args.max_total_tokens * kv_bytes_per_token(cfg, args.resolved_dtype) if args.max_total_tokens
            else int(args.kv_cache_memory * 2**30))
    if pool + n * weights > available:
        gib = 2**30
        given = "--max-total-tokens" if args.max_total_tokens else "--kv-cache-memory"
        raise PlanError(f"{n} replicas need {(pool + n * weights) / gib:.1f} GiB ({given}: a KV pool of {pool / gib:.1f} "
                        f"GiB for all of them, and {n} copies of the {weights / gib:.2f} GiB of weights), more than the "
                        f"{available / gib:.1f} GiB of memory available now ('forkserve capacity' prints what fits)")


def thread_shares(total: int, n: int) -> list[int]:
    """``total`` compute threads over ``n`` replicas, as evenly as they go; at least one
    each (more replicas than threads share cores)."""
    return [max(1, total // n + (i < total % n)) for i in range(n)]


def gateway_command(
    replicas: list[Replica], http: HttpArgs, dp: DataParallelArgs, metrics_port: int, parent_pid: int
) -> list[str]:
    """SGLang's model gateway in front of the replicas, on the user's host and port. Its
    Prometheus endpoint gets a free port of its own (its default, 29000, would clash
    between two servers on one machine); ``--router-args`` come last and win."""
    cmd = [
        *guarded_command(GATEWAY_MODULE, parent_pid),
        "--worker-urls", *(r.url for r in replicas),
        "--policy", dp.router_policy,
        "--host", http.host, "--port", str(http.port),
        "--prometheus-host", http.host, "--prometheus-port", str(metrics_port),
        "--health-check-interval-secs", str(dp.router_health_check_interval),
        "--health-failure-threshold", "2",
        "--health-check-endpoint", HEALTH_CHECK_ENDPOINT,
        "--health-check-timeout-secs", str(HEALTH_CHECK_TIMEOUT_S),
        "--shutdown-grace-period-secs", str(GATEWAY_GRACE_S),
        "--log-level", "warn",
    ]
    user_flags = shlex.split(dp.router_args)
    # A replica's 503 "at capacity" (load shedding, --max-queued-requests) counts as a failure
    # to the gateway's circuit breaker: ten of them shut a healthy replica out for 60 s, and
    # the gateway answered everything "no available workers" meanwhile. Dead replicas are
    # taken out by this launcher and by the health checks instead. (A flag cannot turn it back
    # on, so it is left on where --router-args configure it.)
    if not any(flag.startswith("--cb-") for flag in user_flags):
        cmd.append("--disable-circuit-breaker")
    if dp.router_policy == "cache_aware":
        cmd += ["--balance-abs-threshold", str(GATEWAY_BALANCE[0]), "--balance-rel-threshold", str(GATEWAY_BALANCE[1])]
    if http.api_key:
        cmd += ["--api-key", http.api_key]
    return cmd + user_flags


def local_url(host: str, port: int) -> str:
    """Where this machine reaches a server bound to ``host``."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def check_router_args(router_args: str) -> None:
    """``ValueError`` if the gateway's own parser refuses ``--router-args``: before any
    replica loads, and in one line rather than its usage text."""
    import contextlib
    import io

    from sglang_router.launch_router import parse_router_args

    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(printed):
            parse_router_args(shlex.split(router_args))
    except SystemExit as err:
        if err.code:
            last = (printed.getvalue().strip().splitlines() or ["refused"])[-1]
            raise ValueError(f"--router-args: the gateway refuses them: {last.split('error: ', 1)[-1]}") from None
