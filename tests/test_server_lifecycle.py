"""Startup failures, API keys, queue limits, and a dying scheduler: the server fails fast
and loudly, never hangs, and leaves no process behind."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import socket
import time
from pathlib import Path

import httpx
import openai
import pytest

from runtime.server.server_process import ServerProcess
from tests.proc_utils import pid_alive

pytestmark = pytest.mark.slow

KEY = {"Authorization": "Bearer s3cret"}


def test_port_in_use_fails_fast(server):
    proc = ServerProcess(port=server.port)
    code = proc.proc.wait(60)
    assert code == 1
    assert "cannot listen" in proc.read_output() and str(server.port) in proc.output


def test_missing_model_fails_fast(tmp_path):
    proc = ServerProcess("--model-path", str(tmp_path / "no-such-model"))
    code = proc.proc.wait(120)
    assert code == 1
    assert "model" in proc.read_output().lower() and "no-such-model" in proc.output


@pytest.fixture(scope="module")
def guarded():
    """A server with an API key, no queue beyond two running requests and two model names."""
    proc = ServerProcess("--api-key", "s3cret", "--max-running-requests", "2", "--max-queued-requests", "0",
                         "--served-model-name", "smol", "gpt-4o-mini")
    deadline = time.monotonic() + 180
    while True:  # /health_generate is open, so wait_ready works with a key too
        try:
            proc.wait_ready(timeout=5)
            break
        except TimeoutError:
            assert time.monotonic() < deadline
    yield proc
    proc.stop()


def test_the_grammar_engine_is_loaded_before_any_constrained_request(guarded):
    """Checking a request's regex or schema needs xgrammar (and with it torch, ~2 s); imported
    by the first such request, it would hold the event loop, and every client, that long.
    The HTTP process imports it on a thread of its own at start, unasked (this server has
    had no request yet)."""
    maps = Path(f"/proc/{guarded.proc.pid}/maps")
    deadline = time.monotonic() + 60
    while "libxgrammar_bindings" not in maps.read_text():
        assert time.monotonic() < deadline, "the HTTP process did not load xgrammar"
        time.sleep(0.2)


def test_api_key_required(guarded):
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    assert httpx.post(guarded.url + "/generate", json=body).status_code == 401
    wrong = httpx.post(guarded.url + "/generate", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "API key" in wrong.json()["error"]["message"]
    assert httpx.post(guarded.url + "/generate", json=body, headers=KEY).status_code == 200
    assert httpx.get(guarded.url + "/v1/models").status_code == 401
    assert httpx.get(guarded.url + "/health").status_code == 200
    assert httpx.get(guarded.url + "/metrics").status_code == 200  # Prometheus scrapes without it, as on SGLang
    assert "requests need the --api-key bearer" in guarded.read_output()
    from bench_agent.drivers.openai_chat import OpenAIChatBackend
    from frontend_lang.backend.base import BackendError

    with pytest.raises(BackendError, match="answered 401: .*API key"):  # not "pass the model name"
        OpenAIChatBackend(guarded.url)
    assert OpenAIChatBackend(guarded.url, api_key="s3cret").model == "smol"
    from bench_agent.drivers import kv_probe_for_url

    probe = kv_probe_for_url(guarded.url, "s3cret")  # the bench's KV column read n/a without the key
    assert probe is not None and probe() is not None


def test_several_served_model_names_as_vllm(guarded):
    """``--served-model-name a b`` took ``b`` for the model path. Requests may name any of
    them; answers carry the first; /v1/models lists each."""
    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key="s3cret")
    assert [m.id for m in client.models.list()] == ["smol", "gpt-4o-mini"]
    assert client.models.retrieve("gpt-4o-mini").id == "gpt-4o-mini"
    out = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert out.model == "smol"
    with pytest.raises(openai.NotFoundError, match="serves 'smol'"):
        client.completions.create(model="smol2", prompt="Hi", max_tokens=2)
    assert "(model smol;" in guarded.read_output()


def test_queue_limit_returns_503_with_retry_after(guarded):
    body = {"text": "Count slowly:", "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}}

    def one(_: int) -> httpx.Response:
        return httpx.post(guarded.url + "/generate", json=body, headers=KEY, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(one, range(6)))
    codes = sorted(r.status_code for r in responses)
    assert 200 in codes and 503 in codes, codes
    busy = next(r for r in responses if r.status_code == 503)
    assert busy.headers["retry-after"] == "1"
    assert "capacity" in busy.json()["error"]["message"]
    # more sequences than the server ever admits at once: no retry helps, so a 400 that says so
    too_many = httpx.post(guarded.url + "/generate", headers=KEY, timeout=60,
                          json={**body, "sampling_params": {"max_new_tokens": 1, "n": 3}})
    assert too_many.status_code == 400 and "send fewer" in too_many.json()["error"]["message"], too_many.text


def test_a_busy_server_is_healthy_while_its_queue_holds_the_probe(guarded):
    """/health_generate on a server whose running slots are all taken: its probe waits in the
    queue, but the others' tokens keep coming, so the answer is 200 at once (SGLang's rule),
    not a 503 after the probe's 20 s, which would have an orchestrator restart a loaded
    server; the probe left in the queue is aborted."""
    body = {"text": "A long tale:", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}

    def long_request(rid: str) -> httpx.Response:
        return httpx.post(guarded.url + "/generate", json={**body, "rid": rid}, headers=KEY, timeout=120)

    def stats() -> dict:
        return httpx.get(guarded.url + "/get_server_info", headers=KEY).json()["scheduler"]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = [pool.submit(long_request, f"busy-{i}") for i in range(2)]  # --max-running-requests 2
        deadline = time.monotonic() + 60
        while stats()["num_running_reqs"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        started = time.monotonic()
        probe = httpx.get(guarded.url + "/health_generate", timeout=30)
        assert probe.status_code == 200 and time.monotonic() - started < 10
        deadline = time.monotonic() + 10
        while stats()["num_waiting_reqs"]:  # the probe does not stay behind
            assert time.monotonic() < deadline
            time.sleep(0.2)
        for i in range(2):
            httpx.post(guarded.url + "/abort_request", json={"rid": f"busy-{i}"}, headers=KEY)
        assert all(r.result(timeout=60).status_code == 200 for r in running)


def test_scheduler_death_fails_requests_and_exits_nonzero(guarded):
    info = httpx.get(guarded.url + "/get_server_info", headers=KEY).json()
    pids = info["process_ids"]
    body = {"text": "A long tale:", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}

    def long_request() -> httpx.Response:
        return httpx.post(guarded.url + "/generate", json=body, headers=KEY, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(long_request)
        time.sleep(1.0)
        os.kill(pids["scheduler"], signal.SIGKILL)
        resp = fut.result(timeout=30)  # an answer, not a hang
    assert resp.status_code == 500
    assert "scheduler" in resp.json()["error"]["message"]
    assert guarded.proc.wait(20) != 0
    assert not any(pid_alive(p) for p in pids.values())


@pytest.mark.parametrize("signals", [(signal.SIGTERM,), (signal.SIGINT,), (signal.SIGINT, signal.SIGINT)],
                         ids=["SIGTERM", "SIGINT", "SIGINT twice"])
def test_stopping_answers_requests_in_flight_then_exits_cleanly(signals):
    """A request still running when the server is told to stop gets a JSON 503 (a stream:
    an error event, then [DONE]) instead of a cut connection, as does one whose body is
    still arriving, and the server exits 0 with
    no process left behind; a second Ctrl-C (quit now) answers them so too, at once."""
    proc = ServerProcess().wait_ready()
    pids = proc.info()["process_ids"]
    long_native = {"text": "A long tale:", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
    long_chat = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Tell a long tale."}],
                 "max_tokens": 4000, "ignore_eos": True, "stream": True}

    def plain() -> httpx.Response:
        return httpx.post(proc.url + "/generate", json=long_native, timeout=60)

    def streamed() -> list[str]:
        with httpx.stream("POST", proc.url + "/v1/chat/completions", json=long_chat, timeout=60) as resp:
            assert resp.status_code == 200
            return [line for line in resp.iter_lines() if line]

    uploading = socket.create_connection(("127.0.0.1", proc.port))
    uploading.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"text\": ")  # a body still arriving when the server stops
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = pool.submit(plain), pool.submit(streamed)
        time.sleep(2.0)
        for sig in signals:
            os.kill(proc.proc.pid, sig)
            time.sleep(0.05)
        last_signal = time.monotonic()
        resp, events = futures[0].result(timeout=30), futures[1].result(timeout=30)
        if len(signals) == 2:  # answered at once, not after the grace period (1.5 s) a first signal gives
            assert time.monotonic() - last_signal < 1.0
    assert resp.status_code == 503 and "shutting down" in resp.json()["error"]["message"]
    assert events[-1] == "data: [DONE]" and "shutting down" in events[-2], events[-3:]
    uploading.settimeout(30)
    assert uploading.recv(4096).startswith(b"HTTP/1.1 503"), "a half-sent request: the 503 too, not a 500"
    uploading.close()
    assert proc.proc.wait(20) == 0
    assert not any(pid_alive(p) for p in pids.values())
    assert "Traceback" not in proc.read_output() and "Exception in ASGI" not in proc.output, proc.output
    # What ran was stated before the ready line: dtype, backend, threads, KV pool, context,
    # prefill chunk (by default 256 tokens for float32 on a CPU, 512 for bfloat16), GEMM.
    stated = re.search(r"^forkserve: (\w+) on cpu, attention backend \w+( \(extends on float32 FMAs\))?, \d+ compute threads, "
                       r"KV pool [\d,]+ tokens, weights [\d.]+ GiB, context [\d,]+ tokens, prefill chunks of (\d+) tokens, "
                       r"(bf16 GEMM on|float32 GEMM of our own|oneDNN GEMM|F\.linear)", proc.output, re.MULTILINE)
    assert stated, proc.output
    assert (stated[1], int(stated[3])) in (("float32", 256), ("bfloat16", 512)), stated[0]
    assert proc.output.index("forkserve: ") < proc.output.index("forkserve ready:")
