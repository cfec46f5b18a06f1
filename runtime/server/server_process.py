"""Start and stop a real ``forkserve serve`` process (the DSL's ``Runtime``, benchmarks and tests use it)."""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time

import httpx

from runtime.ipc import free_tcp_port
from runtime.server.orphan_guard import guarded_command


class ServerProcess:
    def __init__(self, *args: str, port: int | None = None) -> None:
        given = _flag_value(args, "--port")  # in the flags (bench's --server-args): that one is used
        self.port = int(given) if given is not None and given.isdigit() else port or free_tcp_port()
        self.url = f"http://{_connect_host(args)}:{self.port}"
        # Guarded: a parent killed without stopping it (a killed test run or benchmark)
        # takes the server with it. Watch only: it may be started from a passing thread.
        cmd = [*guarded_command("runtime.cli", watch_only=True), "serve", "--port", str(self.port), *args]
        # A file, not a pipe: a pipe nobody reads fills up and blocks the server's logging.
        self.log = tempfile.NamedTemporaryFile("w+", prefix="forkserve-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def wait_ready(self, timeout: float = 180.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.read_output()}")
            try:
                if httpx.get(self.url + "/health_generate", timeout=30).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not ready after {timeout}s")

    def read_output(self) -> str:
        with open(self.log.name) as f:
            self.output = f.read()
        return self.output

    def info(self) -> dict:
        return httpx.get(self.url + "/get_server_info", timeout=30).json()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def _flag_value(args: tuple[str, ...], flag: str) -> str | None:
    """The value ``args`` give ``flag`` (``--flag V`` or ``--flag=V``; the last one wins, as on
    the command line), or None."""
    value = None
    for k, arg in enumerate(args):
        if arg == flag and k + 1 < len(args):
            value = args[k + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _connect_host(args: tuple[str, ...]) -> str:
    """Where to reach a server started with ``args``: its ``--host`` (a wildcard address as
    this machine's loopback), by default 127.0.0.1."""
    host = _flag_value(args, "--host") or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host
