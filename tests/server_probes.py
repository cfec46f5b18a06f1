"""Probing a live server in tests: a JSON POST, its Prometheus counters, waiting until it is
idle, and a request whose client leaves at once."""

from __future__ import annotations

import socket
import time

import httpx
import orjson

ABORTED = "forkserve:requests_aborted_total"
FINISHED = "forkserve:requests_finished_total"
RECEIVED = "forkserve:requests_total"
# /v1/responses fields of a response still running when a test acts on it: greedy, the
# default model writes all 500 numbers (~2,000 tokens). ``ignore_eos`` would not do: it is
# no field of the Responses API (the server ignores it there), and a sampled answer of a few
# dozen tokens could end before the client's leaving was noticed.
LONG_RESPONSE = {"input": "Write the numbers from 1 to 500, separated by commas.", "temperature": 0,
                 "max_output_tokens": 3000}


def post(server, path: str, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=timeout)


def wait_idle(server, timeout: float = 15.0) -> dict:
    """The scheduler's stats once nothing runs or waits."""
    deadline = time.monotonic() + timeout
    while True:
        sched = server.info()["scheduler"]
        if sched["num_running_reqs"] == 0 and sched["num_waiting_reqs"] == 0:
            return sched
        assert time.monotonic() < deadline, f"server never went idle: {sched}"
        time.sleep(0.2)


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


def post_and_leave(server, path: str, body: dict, timeout: float = 15.0) -> None:
    """POST ``body`` as JSON to ``path`` and close the connection before reading a byte of
    the answer, once the server has taken the request in (``requests_total`` grew): closed
    sooner, on a busy machine, the server may see the close before it reads the body, and
    then there is no request to abort."""
    payload = orjson.dumps(body)
    url = httpx.URL(server.url)
    received = metric(server, RECEIVED)
    with socket.create_connection((url.host, url.port)) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        deadline = time.monotonic() + timeout
        while metric(server, RECEIVED) == received:
            assert time.monotonic() < deadline, f"the server never took in the request to {path}"
            time.sleep(0.02)
