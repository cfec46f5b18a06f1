"""``forkserve bench --compare URL``: each workload on forkserve, then on another
OpenAI-compatible server, in one run, with the ratios.

One engine at a time on a quiet machine: on 2 cores a second engine left running (even
idle: vLLM's CPU worker spins a core) skews the first. So, per workload:
  1. a fresh local forkserve server (unless ``--url``) runs it and is stopped;
  2. with ``--compare-cmd``, the other server is started by that shell command in its own
     process group, waited for on ``URL/v1/models``, runs the same programs (same seed,
     sizes, concurrency, always through the OpenAI chat driver) and its whole group is
     stopped; without ``--compare-cmd`` the server at URL is used as it is.
The table then has both rows per workload, and a second table the ratios forkserve / other
for programs/s and TTFT p50 (lower is better for TTFT, so the ratio there is other / ours).

With ``--rounds N`` each workload runs N times on each server, alternating which goes first
(ours-theirs, theirs-ours, ...), and the ratio table gives the median of the rounds' ratios
with each round's: a machine whose speed drifts over minutes then weighs on both sides alike.

    forkserve bench --backend openai --workload critique --workload tot \\
        --compare http://127.0.0.1:8001 --compare-cmd "vllm serve ... --port 8001"
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx

from bench_agent.drivers import KVProbe, kv_probe_for_url
from bench_agent.measure import finish, measure, open_driver, selected_workloads
from frontend_lang.backend.base import Backend


def add_compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compare", metavar="URL", help="After each workload on forkserve, run it on this other "
                   "OpenAI-compatible server (OpenAI chat driver, same programs) and print both with their ratios.")
    p.add_argument("--compare-cmd", metavar="CMD", help="Shell command that starts the --compare server in the "
                   "foreground; it is started fresh for each workload after forkserve is stopped, and its whole "
                   "process group is stopped after, so only one engine runs at a time. Its environment has "
                   "VLLM_SERVER_DEV_MODE=1, which gives a vLLM server the /reset_prefix_cache route, so that its "
                   "cache is emptied after the warm-up as forkserve's is.")
    p.add_argument("--compare-label", help="Name of the --compare server in the tables (default: its URL).")
    p.add_argument("--compare-timeout", type=float, default=600.0, help="Seconds to wait for the --compare-cmd "
                   "server to answer /v1/models (default: %(default)s).")
    p.add_argument("--rounds", type=int, default=1, help="With --compare: run each workload this many times on "
                   "each server, alternating which goes first, and report the median ratio (default: %(default)s).")


class PeerServer:
    """A server started by a shell command in its own process group, output to a file."""

    def __init__(self, cmd: str, url: str) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.log = tempfile.NamedTemporaryFile("w+", prefix="forkserve-compare-", suffix=".log")  # noqa: SIM115
        # vLLM answers /reset_prefix_cache only in its development mode; with it both sides of a
        # comparison start measuring from an empty cache (see measure.measure).
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        self.proc = subprocess.Popen(cmd, shell=True, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=env)

    def wait_ready(self, timeout: float) -> PeerServer:
        """Return once the server answers /v1/models; on anything else (it exits, the time
        runs out, Ctrl-C while it starts) stop its process group first: nothing is left."""
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                tail = self.log.read()[-3000:]
                raise RuntimeError(f"the --compare-cmd server exited with {self.proc.returncode}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/v1/models", timeout=10).status_code == 200:
                    return
            time.sleep(1.0)
        raise TimeoutError(f"the --compare-cmd server did not answer {self.url}/v1/models within {timeout:.0f} s")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM to the whole group, SIGKILL to whatever is left after ``timeout``."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # workers that outlived the leader
        self.proc.wait()
        # The next engine must not start while this one's processes still hold a core.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        self.log.close()


@contextlib.contextmanager
def peer_running(ns: argparse.Namespace) -> Iterator[None]:
    """The --compare server up for the block: started fresh by --compare-cmd and stopped
    after it, or, without one, the server already at --compare."""
    if not ns.compare_cmd:
        yield
        return
    print(f"starting the compared server: {ns.compare_cmd}", file=sys.stderr)
    peer = PeerServer(ns.compare_cmd, ns.compare).wait_ready(ns.compare_timeout)
    try:
        yield
    finally:
        peer.stop()


@contextlib.contextmanager
def open_peer(ns: argparse.Namespace) -> Iterator[tuple[Backend, KVProbe | None, str]]:
    """The --compare server as an OpenAI chat backend (started fresh with --compare-cmd)."""
    from bench_agent.drivers.openai_chat import OpenAIChatBackend

    with peer_running(ns):
        backend = OpenAIChatBackend(ns.compare, None, ns.api_key)
        try:
            yield backend, kv_probe_for_url(ns.compare, ns.api_key), ns.compare_label or f"openai @ {ns.compare}"
        finally:
            backend.shutdown()


def run_compared(ns: argparse.Namespace) -> int:
    """Each workload on forkserve (fresh local server unless --url) and on the other, one at
    a time, ``--rounds`` times with the order alternating; rows in pairs (ours, theirs)."""
    concurrency = ns.concurrency or 8
    rows: list[dict[str, Any]] = []
    for workload in selected_workloads(ns):
        for number in range(ns.rounds):
            pair: dict[str, dict[str, Any]] = {}
            for side in ("ours", "theirs") if number % 2 == 0 else ("theirs", "ours"):
                opened, driver = (open_driver, ns.backend) if side == "ours" else (open_peer, "openai")
                with opened(ns) as (backend, probe, label):
                    pair[side] = measure(workload, backend, ns, driver, label, probe, ns.num_programs, concurrency)
                if ns.rounds > 1:
                    pair[side].update(round=number + 1, backend=f"{pair[side]['backend']} (round {number + 1})")
            rows += [pair["ours"], pair["theirs"]]
    return finish(rows, ns, title=f"forkserve bench ({ns.size}) vs {ns.compare_label or ns.compare}",
                  extra_markdown=ratio_table(rows))


def ratio_table(rows: list[dict[str, Any]]) -> str:
    """Per workload (rows in pairs: forkserve, then the other, one pair per round):
    programs/s ours / theirs and TTFT p50 theirs / ours, so that above 1 means forkserve is
    ahead on both; over several rounds the median, then each round's in brackets."""
    ratios: dict[str, list[tuple[float | None, float | None]]] = {}
    for ours, theirs in zip(rows[::2], rows[1::2], strict=True):
        rate = ours["programs_per_s"] / theirs["programs_per_s"] if theirs["programs_per_s"] else None
        a, b = ours.get("ttft_ms_p50"), theirs.get("ttft_ms_p50")
        ratios.setdefault(ours["workload"], []).append((rate, b / a if a and b else None))
    lines = ["| workload | forkserve / other programs/s | other / forkserve TTFT p50 |", "|---|---|---|"]
    for workload, rounds in ratios.items():
        lines.append(f"| {workload} | {_summary([r[0] for r in rounds])} | {_summary([r[1] for r in rounds])} |")
    return "\n".join(lines)


def _summary(values: list[float | None]) -> str:
    """One ratio, or the median of several (of those known) with each listed."""
    if len(values) == 1:
        return _x(values[0])
    known = [v for v in values if v is not None]
    return f"{_x(statistics.median(known) if known else None)} ({', '.join(_x(v) for v in values)})"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def check_compare_args(ns: argparse.Namespace) -> None:
    if ns.rounds < 1 or (ns.rounds > 1 and not ns.compare):
        raise ValueError("--rounds takes a count of at least 1, and applies with --compare only")
    if ns.compare_cmd and not ns.compare:
        raise ValueError("--compare-cmd needs --compare URL (where that server listens)")
    if ns.compare and (ns.suite or ns.backend == "hf" or ns.in_process):
        raise ValueError("--compare measures a forkserve server (--backend dsl or openai) against another server; "
                         "it does not combine with --suite, --backend hf or --in-process")
    if ns.compare and not shlex.split(ns.compare_cmd or ""):
        print("note: without --compare-cmd the compared server stays up while forkserve is measured; on few "
              "cores an idle engine can still take a core", file=sys.stderr)
