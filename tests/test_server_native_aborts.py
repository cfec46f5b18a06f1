"""SGLang's native API against a real server, when requests end early: a client that leaves
(streamed or not, before its stream began, while sending its body) and ``/abort_request``
by rid, by what a rid expanded into, for requests still arriving and for OpenAI requests;
each frees its KV slots."""

from __future__ import annotations

import re
import time

import httpx
import orjson
import pytest

from tests.server_probes import (
    ABORTED,
    FINISHED,
    LONG_RESPONSE,
    metric,
    post,
    post_and_leave,
    wait_for_aborts,
    wait_idle,
)

pytestmark = pytest.mark.slow


def test_stream_disconnect_frees_slots(server):
    aborted = metric(server, ABORTED)
    body = {"text": "Write a very long story.", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}, "stream": True}
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=120) as resp:
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few tokens in
    assert any(line.startswith("data: ") for line in got)
    sched = wait_idle(server)
    assert sched["kv_held_by_requests"] == 0 and sched["kv_protected"] == 0
    assert sched["kv_invariant_holds"] is True
    assert metric(server, ABORTED) == aborted + 1


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "A long story, please.", "stream": True,
                   "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}),
    ("/v1/chat/completions", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "A long story, please."}], "stream": True,
                              "max_tokens": 3000, "ignore_eos": True}),
    ("/v1/responses", {"model": "SmolLM2-135M-Instruct", "stream": True, "store": False, **LONG_RESPONSE}),
])
def test_stream_whose_client_left_before_it_began_is_aborted(server, path, body):
    """The client sends a streamed request and closes the connection before reading a byte:
    its request is aborted, not run to max_new_tokens holding its KV slots. (Starlette starts
    the events generator even then and cancels it at its first wait, so the generator's own
    cleanup aborts the request.)"""
    aborted = metric(server, ABORTED)
    post_and_leave(server, path, body)
    wait_for_aborts(server, aborted)  # once the server has read and submitted the request
    sched = wait_idle(server)
    assert sched["kv_held_by_requests"] == 0 and sched["kv_invariant_holds"] is True


def test_abort_request_ends_a_request_by_its_rid_or_all_of_them(server):
    """SGLang's ``POST /abort_request``: the aborted request ends at the scheduler's next
    step with an ``abort`` finish reason and what it generated so far, as SGLang answers
    (a client keeps a partial sample); ``abort_all`` ends every one."""
    import concurrent.futures

    long = {"max_new_tokens": 3000, "ignore_eos": True}

    def generate(rid: str) -> dict:
        return post(server, "/generate", {"text": "A long story.", "rid": rid, "sampling_params": long}).json()

    aborted, finished = metric(server, ABORTED), metric(server, FINISHED)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        one = pool.submit(generate, "abort-me")
        wait_for_running(server, 1)
        wait_for_steps(server, 3)  # a few tokens
        assert post(server, "/abort_request", {"rid": "abort-me"}).status_code == 200
        out = one.result(timeout=30)
        meta = out["meta_info"]
        assert meta["finish_reason"] == {"type": "abort", "message": "aborted by /abort_request"}
        assert meta["id"] == "abort-me" and meta["completion_tokens"] == len(out["output_ids"]) > 0
        detokenized = post(server, "/detokenize", {"tokens": out["output_ids"]}).json()
        assert out["text"] == detokenized["text"] != ""
        # counted as aborted, not finished (/metrics)
        assert (metric(server, ABORTED), metric(server, FINISHED)) == (aborted + 1, finished)
        assert post(server, "/abort_request", {"rid": "no-such-request"}).status_code == 200
        both = [pool.submit(generate, f"all-{i}") for i in range(2)]
        wait_for_running(server, 2)
        assert post(server, "/abort_request", {"abort_all": True}).status_code == 200
        assert [f.result(timeout=30)["meta_info"]["finish_reason"]["type"] for f in both] == ["abort", "abort"]
        # a batch under one rid runs as rid_0, rid_1: the rid aborts all of it
        batch = pool.submit(lambda: post(server, "/generate", {"text": ["A long story.", "Another one."], "rid": "batch",
                                                               "sampling_params": long}).json())
        wait_for_running(server, 2)
        assert post(server, "/abort_request", {"rid": "batch"}).status_code == 200
        assert [o["meta_info"]["finish_reason"]["type"] for o in batch.result(timeout=30)] == ["abort", "abort"]
    sched = wait_idle(server)
    assert sched["kv_held_by_requests"] == 0 and sched["kv_invariant_holds"] is True


def test_abort_request_ends_only_the_rid_and_what_was_expanded_from_it(server):
    """A client's own rid that begins with another's plus "_" (``job_2`` beside ``job``) is not
    one of ``job``'s expansions (``job_0``, ``job_1`` of a batch): aborting ``job`` leaves it."""
    import concurrent.futures

    long = {"max_new_tokens": 3000, "ignore_eos": True}

    def generate(rid: str | None, text: str | list[str] = "A long story.") -> dict:
        return post(server, "/generate", {"text": text, "rid": rid, "sampling_params": long}).json()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        job, other = pool.submit(generate, "job"), pool.submit(generate, "job_2")
        wait_for_running(server, 2)
        assert post(server, "/abort_request", {"rid": "job"}).status_code == 200
        assert job.result(timeout=30)["meta_info"]["finish_reason"]["type"] == "abort"
        wait_for_steps(server, 2)
        assert not other.done() and server.info()["scheduler"]["num_running_reqs"] == 1
        assert post(server, "/abort_request", {"rid": "job_2"}).status_code == 200
        assert other.result(timeout=30)["meta_info"]["finish_reason"]["type"] == "abort"
    wait_idle(server)


def test_an_abort_that_comes_while_the_request_is_still_arriving_ends_it(server):
    """``/abort_request`` for a request whose body the server is still reading (or whose
    prompt it is still tokenizing), so that it is not yet submitted: it is ended as soon as it
    is, not run to the end. A request sent after the abort with the same rid runs."""
    import socket

    body = orjson.dumps({"text": "A long story.", "rid": "late-abort", "stream": False,
                         "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}})
    url = httpx.URL(server.url)
    with socket.create_connection((url.host, url.port)) as sock:
        sock.sendall(f"POST /generate HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
        time.sleep(1.0)  # the server has begun to read the body
        assert post(server, "/abort_request", {"rid": "late-abort"}).status_code == 200
        sock.sendall(body[10:])
        sock.settimeout(60)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _content_length(answer):
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection"
            answer += chunk
    out = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert out["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted by /abort_request"}
    assert out["meta_info"]["completion_tokens"] < 400
    again = post(server, "/generate", {"text": "Hi", "rid": "late-abort", "sampling_params": {"max_new_tokens": 2}})
    assert again.json()["meta_info"]["finish_reason"]["type"] == "length"
    wait_idle(server)


def test_a_client_that_leaves_while_sending_its_body_is_no_server_error(server):
    """Headers that promise 1,000 bytes, 9 of them, then the connection closes: nothing to
    answer, nothing for the log to hold a traceback of, and the server serves on."""
    import socket

    url = httpx.URL(server.url)
    before = server.read_output().count("unexpected error")
    for path in ("/generate", "/v1/chat/completions"):
        with socket.create_connection((url.host, url.port)) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
                         "Content-Length: 1000\r\n\r\n{\"text\": ".encode())
            time.sleep(0.3)
    time.sleep(0.5)
    assert post(server, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    assert server.read_output().count("unexpected error") == before, server.output[-3000:]


def _content_length(response: bytes) -> int:
    head = response.split(b"\r\n\r\n", 1)[0].decode().lower()
    return int(re.search(r"content-length: (\d+)", head).group(1))


def test_abort_request_finds_openai_requests_by_their_rid(server):
    """SGLang's ``rid`` on the OpenAI routes names the requests, so ``/abort_request`` ends
    them: the answer so far, finish reason ``abort``; ``n > 1`` runs as rid_0, rid_1."""
    import concurrent.futures

    model = "SmolLM2-135M-Instruct"
    chat = {"model": model, "messages": [{"role": "user", "content": "A long story."}], "max_tokens": 3000,
            "ignore_eos": True, "rid": "chat-1", "n": 2}
    completion = {"model": model, "prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "rid": "cmpl-1"}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for path, body, running in (("/v1/chat/completions", chat, 2), ("/v1/completions", completion, 1)):
            answer = pool.submit(post, server, path, body)
            wait_for_running(server, running)
            wait_for_steps(server, 3)
            assert post(server, "/abort_request", {"rid": body["rid"]}).status_code == 200
            out = answer.result(timeout=30).json()
            assert [c["finish_reason"] for c in out["choices"]] == ["abort"] * running
            assert 0 < out["usage"]["completion_tokens"] < 3000 * running
    wait_idle(server)


def wait_for_steps(server, n: int, timeout: float = 30.0) -> None:
    """Until the engine has run ``n`` more forward steps (the running requests have tokens)."""
    start = server.info()["scheduler"]["num_forward_steps"]
    deadline = time.monotonic() + timeout
    while server.info()["scheduler"]["num_forward_steps"] < start + n:
        assert time.monotonic() < deadline, "the engine made no steps"
        time.sleep(0.02)


def wait_for_running(server, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while server.info()["scheduler"]["num_running_reqs"] < n:
        assert time.monotonic() < deadline, "the requests never started"
        time.sleep(0.05)


def test_non_stream_disconnect_frees_slots(server):
    body = {"text": "Another long story.", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with pytest.raises(httpx.ReadTimeout):
        post(server, "/generate", body, timeout=1.5)
    sched = wait_idle(server)
    assert sched["kv_held_by_requests"] == 0 and sched["kv_invariant_holds"] is True
