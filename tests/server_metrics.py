"""Reading a live server's Prometheus counters in tests."""

from __future__ import annotations

import time

import httpx

ABORTED = "forkserve:requests_aborted_total"


def metric(server, name: str) -> float:
    """The value of counter ``name`` on ``server`` (a ``ServerProcess``) now."""
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")


def wait_for_aborts(server, before: float, count: int = 1, timeout: float = 15.0) -> None:
    """Wait until ``count`` more requests than ``before`` have been aborted, and no more."""
    deadline = time.monotonic() + timeout
    while (now := metric(server, ABORTED)) < before + count:
        assert time.monotonic() < deadline, f"{before + count - now:g} of {count} requests were never aborted"
        time.sleep(0.1)
    assert now == before + count, f"{now - before:g} requests aborted, {count} expected"
