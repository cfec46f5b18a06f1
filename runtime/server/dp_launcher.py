"""``forkserve serve --dp-size N``: start N replicas and SGLang's model gateway in front of
them, print one URL, watch them, and stop all of them on SIGINT/SIGTERM.

Order: the user's port must be free; the replicas start together (each a whole
``forkserve serve`` on 127.0.0.1, see ``data_parallel.py``) and each must print its ready
line; then the gateway starts and must report every replica healthy; then the URL is
printed. Each child runs in its own session, so a terminal's Ctrl-C reaches only this
process, which stops the gateway and the replicas together (``stop``), and finally kills
whatever is left of each child's process group. Children also get SIGTERM if this
process dies (``orphan_guard.py``).

A replica that dies is reported here and taken out of the gateway at once (its health checks
would take ~10 s); the others keep serving. If the gateway dies, or every replica, this process
stops the rest and exits with code 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import IO

import httpx

from runtime.config import ServerArgs
from runtime.executor.compute_threads import available_cores
from runtime.serve_args import DataParallelArgs, HttpArgs
from runtime.server import orphan_guard
from runtime.server.data_parallel import (
    INSTALL_HINT,
    REPLICA_HOST,
    Replica,
    check_router_args,
    gateway_command,
    gateway_installed,
    local_url,
    plan_replicas,
)
from runtime.server.launch import (
    DEAD_PROCESS_LINE,
    FAILURE_NOTICE_ENV,
    StartupError,
    bind_port,
    stopped_by_signal,
)

_READY_LINE = "forkserve ready:"
# What uvicorn logs when the gateway, registering a worker, also probes it for gRPC (it
# tries HTTP and gRPC at once); only dropped until the gateway is up.
_GRPC_PROBE_LINE = "Invalid HTTP request received."
# The colours of the gateway's log lines, dropped: the lines go to our stderr, often a file.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_MODEL_IN_READY_LINE = re.compile(r"\(model (.+?);")
_DEAD_PROCESS = re.compile(re.escape(DEAD_PROCESS_LINE).replace(re.escape("{}"), ".+"))
# How long a replica that lost a process waits before failing its open requests: time for
# ``_watch`` (every 0.1 s) to take it out of the gateway, so that the gateway retries them
# on another replica, not on it again.
_FAILURE_NOTICE_S = 1.0
_REPLICA_STOP_S = 12.0  # a replica's own shutdown: 1.5 s grace, 3 s to answer, 3 s for its children
_GATEWAY_READY_S = 60.0


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[str]
    ready: threading.Event = field(default_factory=threading.Event)
    registered: threading.Event = field(default_factory=threading.Event)
    reported: bool = False
    model: str | None = None  # the model its ready line names
    # it printed that one of its processes died (``DEAD_PROCESS_LINE``): it fails its open
    # requests after the notice, and is to leave the gateway before then
    lost_process: threading.Event = field(default_factory=threading.Event)

    def forward_output(self, stream: IO[str]) -> None:
        """Copy the child's output to our stderr, each line tagged with its name but the JSON
        lines of --log-requests-format json (objects alone, for log collectors; each has its rid)."""
        for line in stream:
            if line.startswith(_READY_LINE):
                named = _MODEL_IN_READY_LINE.search(line)
                self.model = named.group(1) if named else None
                self.ready.set()
            if _DEAD_PROCESS.match(line):
                self.lost_process.set()
            if _GRPC_PROBE_LINE in line and not self.registered.is_set():
                continue
            line = _ANSI_ESCAPE.sub("", line)
            sys.stderr.write(line if line.startswith("{") else f"[{self.name}] {line}")
            sys.stderr.flush()


class DataParallelLauncher:
    def __init__(self, args: ServerArgs, http: HttpArgs, dp: DataParallelArgs) -> None:
        self.args, self.http, self.dp = args, http, dp
        self.replicas: list[Replica] = []
        self.children: list[Child] = []
        self.gateway: Child | None = None
        self.url = local_url(http.host, http.port)
        self.run_dir: str | None = None
        self.metrics_port = 0
        self.announced_ready = False  # the ready line is out

    def run(self) -> int:
        if not gateway_installed():
            raise StartupError(f"--dp-size {self.dp.dp_size} puts SGLang's model gateway in front of the replicas, "
                               f"and it is not installed: {INSTALL_HINT}")
        if self.dp.router_args:
            check_router_args(self.dp.router_args)
        # The user's port fails now if taken, not after N models load, and stays held (as do
        # the others) until just before its server starts, so nothing else takes it meanwhile.
        held = [bind_port(self.http.host, self.http.port)]
        try:
            if self.http.response_store is None:
                # The replicas share one store of /v1/responses: the gateway may send a continuation
                # (previous_response_id) to a replica other than the one that answered first.
                self.run_dir = tempfile.mkdtemp(prefix="forkserve-dp-")
                self.http = dataclasses.replace(self.http, response_store=os.path.join(self.run_dir, "responses.sqlite"))
            held += reserve_ports(self.dp.dp_size + 1)
            *ports, self.metrics_port = [s.getsockname()[1] for s in held[1:]]
            self.replicas = plan_replicas(self.args, self.http, self.dp, ports)
            threads = self.args.num_threads or available_cores()
            if self.dp.dp_size > threads:
                print(f"forkserve: warning: {self.dp.dp_size} replicas on {threads} compute threads "
                      f"({'--num-threads' if self.args.num_threads else 'cores'}): each replica gets one thread, "
                      "and they take turns on the cores", file=sys.stderr, flush=True)
            for s in held[1:-1]:
                s.close()
            for r in self.replicas:
                self.children.append(self._spawn(f"replica {r.index}", r.command(os.getpid())))
            self._wait_replicas()
            command = gateway_command(self.replicas, self.http, self.dp, self.metrics_port, os.getpid())
            for s in (held[0], held[-1]):
                s.close()
            self.gateway = self._spawn("gateway", command)
            self._wait_gateway()
            self._print_ready()
            return self._watch()
        finally:
            for s in held:
                s.close()
            self.stop()

    def _spawn(self, name: str, command: list[str]) -> Child:
        env = {**os.environ, FAILURE_NOTICE_ENV: str(_FAILURE_NOTICE_S)}
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", bufsize=1, start_new_session=True, env=env)
        child = Child(name, proc)
        assert proc.stdout is not None
        threading.Thread(target=child.forward_output, args=(proc.stdout,), daemon=True, name=f"{name} output").start()
        return child

    def _wait_replicas(self) -> None:
        deadline = time.monotonic() + self.http.startup_timeout
        while not all(c.ready.is_set() for c in self.children):
            for c in self.children:
                if c.proc.poll() is not None and not c.ready.is_set():
                    raise StartupError(f"{c.name} exited with code {c.proc.returncode} before it was ready "
                                       "(its output is above)")
            if time.monotonic() > deadline:
                raise StartupError(f"the replicas were not ready after {self.http.startup_timeout:.0f} s "
                                   "(--startup-timeout)")
            time.sleep(0.1)

    def _wait_gateway(self) -> None:
        """Until the gateway lists every replica as a healthy worker."""
        assert self.gateway is not None
        headers = self._gateway_headers
        deadline = time.monotonic() + _GATEWAY_READY_S
        healthy: list[str] = []
        while time.monotonic() < deadline:
            if self.gateway.proc.poll() is not None:
                raise StartupError(f"the gateway exited with code {self.gateway.proc.returncode} (its output is above)")
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
                workers = httpx.get(f"{self.url}/workers", headers=headers, timeout=5).json()["workers"]
                healthy = [w["url"] for w in workers if w.get("is_healthy")]
                if sorted(healthy) == sorted(r.url for r in self.replicas):
                    for c in self.children:
                        c.registered.set()
                    return
            time.sleep(0.2)
        raise StartupError(f"the gateway did not report the {len(self.replicas)} replicas healthy within "
                           f"{_GATEWAY_READY_S:.0f} s (healthy: {healthy or 'none'})")

    def _print_ready(self) -> None:
        for r, c in zip(self.replicas, self.children, strict=True):
            print(f"forkserve: replica {r.index} at {r.url} (pid {c.proc.pid}), {r.args.num_threads} compute threads",
                  flush=True)
        host = f"[{self.http.host}]" if ":" in self.http.host else self.http.host
        print(f"forkserve: gateway metrics (Prometheus) at http://{host}:{self.metrics_port}/metrics", flush=True)
        model = f"model {self.children[0].model}; " if self.children[0].model else ""
        key = "; requests need the --api-key bearer" if self.http.api_key else ""
        print(f"forkserve ready: http://{host}:{self.http.port} ({model}{len(self.replicas)} replicas behind SGLang's "
              f"model gateway, policy {self.dp.router_policy}; OpenAI API under /v1{key})", flush=True)
        self.announced_ready = True

    def _watch(self) -> int:
        assert self.gateway is not None
        while True:
            time.sleep(0.1)
            if self.gateway.proc.poll() is not None:
                print(f"forkserve: the gateway exited with code {self.gateway.proc.returncode}; stopping the replicas",
                      file=sys.stderr, flush=True)
                return 1
            for r, c in zip(self.replicas, self.children, strict=True):
                if (c.proc.poll() is not None or c.lost_process.is_set()) and not c.reported:
                    c.reported = True
                    how = ("taken out of the gateway" if self._remove_workers([r.url]) else
                           f"the gateway's health checks take it out of rotation (every "
                           f"{self.dp.router_health_check_interval} s)")
                    what = (f"exited with code {c.proc.returncode}" if c.proc.poll() is not None else
                            "lost one of its processes and is stopping")
                    others = any(o.proc.poll() is None and not o.lost_process.is_set() for o in self.children)
                    print(f"forkserve: replica {r.index} ({r.url}) {what}; {how}"
                          f"{'; the other replicas keep serving' if others else ''}", file=sys.stderr, flush=True)
            if all(c.proc.poll() is not None for c in self.children):
                print("forkserve: every replica has exited; stopping the gateway", file=sys.stderr, flush=True)
                return 1

    @property
    def _gateway_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.http.api_key}"} if self.http.api_key else {}

    def _remove_workers(self, urls: list[str], timeout: float = 5.0) -> bool:
        """Take replicas out of the gateway at once: a dead one (its health checks need two
        misses, ~10 s, while requests sent to it in between fail), or all of them at shutdown.
        The gateway answers a removal at once (202) and does it in the background, so this
        waits until its worker list no longer holds them. False if the gateway would not, or
        had not within ``timeout`` in all."""
        headers = self._gateway_headers
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        def registered() -> dict[str, str]:
            workers = httpx.get(f"{self.url}/workers", headers=headers, timeout=left()).json()["workers"]
            return {w["url"]: w["id"] for w in workers if w.get("url") in urls}

        try:
            for worker_id in registered().values():
                if httpx.delete(f"{self.url}/workers/{worker_id}", headers=headers, timeout=left()).status_code >= 300:
                    return False
            while registered():
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)
            return True
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return False

    def stop(self) -> None:
        """The replicas out of the gateway, then the gateway and the replicas together: the
        gateway takes no new connections and waits up to its grace period for the requests it
        forwarded, while each replica answers what it still runs after its own grace (a 503, a
        stream's error event), which the gateway passes on (a 503 it would retry finds no
        replica: its own 503, where a stopping replica gave a 500 naming it); then whatever
        is left in each child's process group. (Stopping the gateway first cut those requests
        off unanswered when its grace ran out.) Signals wait until it is done: a second Ctrl-C
        must not leave a replica running."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        gateway_up = self.gateway is not None and self.gateway.proc.poll() is None
        if gateway_up and not self._remove_workers([r.url for r in self.replicas], timeout=2.0):  # a hung gateway
            print("forkserve: the gateway did not take the replicas out within 2 s; requests it still sends "
                  "them while they stop may fail with its 500", file=sys.stderr, flush=True)
        _terminate([*([self.gateway] if self.gateway else []), *self.children], _REPLICA_STOP_S)
        for c in [*self.children, *([self.gateway] if self.gateway else [])]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGKILL)
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)


def reserve_ports(n: int) -> list[socket.socket]:
    """``n`` sockets bound to different free ports of 127.0.0.1; close one to hand its port on."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((REPLICA_HOST, 0))
        socks.append(s)
    return socks


def _terminate(children: list[Child], timeout: float) -> None:
    for c in children:
        if c.proc.poll() is None:
            c.proc.terminate()
    deadline = time.monotonic() + timeout
    for c in children:
        try:
            c.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()


def serve_data_parallel(args: ServerArgs, http: HttpArgs, dp: DataParallelArgs) -> int:
    """Run replicas and gateway until SIGINT/SIGTERM (exit code 0; 130 before they were
    ready) or until the gateway or every replica dies (1)."""
    signal.signal(signal.SIGTERM, orphan_guard.interrupt)
    # Ctrl-C too, even where this process started with SIGINT ignored (a shell's background job)
    signal.signal(signal.SIGINT, orphan_guard.interrupt)
    launcher = DataParallelLauncher(args, http, dp)
    try:
        return launcher.run()
    except KeyboardInterrupt:
        return stopped_by_signal(launcher.announced_ready)
    except (StartupError, ValueError) as err:
        print(f"forkserve: {err}", file=sys.stderr, flush=True)
        return 1
