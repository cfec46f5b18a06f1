"""``--log-requests`` (``runtime/server/request_log.py``): what each level writes when a
request arrives and ends, in text and JSON, written once per request; then a real server
started with the flags, changed while serving through ``POST /configure_logging`` (SGLang's),
whose bad values are 400s."""

from __future__ import annotations

import json
import logging
import re
import time

import httpx
import pytest

from runtime.sampling.params import SamplingParams
from runtime.server.request_log import RequestLog
from runtime.server.scheduler_client import ReqState

PROMPT_IDS = list(range(10))


def _state(rid: str = "r1", text: str = "The answer.") -> ReqState:
    state = ReqState(rid, len(PROMPT_IDS), False, 0, rid + "#0", stream=True)
    state.output_ids, state.text, state.cached_tokens = [7, 8, 9], text, 4
    state.finished_reason = {"type": "stop", "matched": 2}
    state.first_token_at = state.created_at + 0.05
    state.finished_at = state.created_at + 0.2
    return state


def _logged(caplog, log: RequestLog, state: ReqState, params: SamplingParams) -> list[str]:
    with caplog.at_level(logging.INFO, logger="forkserve.requests"):
        log.received(state, PROMPT_IDS, params)
        log.ended(state)
        log.ended(state)  # a second end (a late update after an error) is not written again
    return [r.getMessage() for r in caplog.records if r.name == "forkserve.requests"]


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_each_level_adds_what_it_says(level, caplog):
    log = RequestLog(enabled=True, level=level, format="json", decode=lambda ids: "p" * 5000)
    lines = _logged(caplog, log, _state(text="o" * 3000), SamplingParams(temperature=0.0, max_new_tokens=20))
    received, ended = (json.loads(line) for line in lines)
    assert received["event"] == "request.received" and received["rid"] == "r1" and received["prompt_tokens"] == 10
    assert ended["event"] == "request.ended" and ended["finish_reason"] == {"type": "stop", "matched": 2}
    assert (ended["cached_tokens"], ended["completion_tokens"], ended["first_token_s"], ended["total_s"]) == (4, 3, 0.05, 0.2)
    assert ("sampling_params" in received) == (level >= 1)
    if level >= 1:  # only what differs from the defaults
        assert received["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 20}
    assert ("prompt" in received) == ("output" in ended) == (level >= 2)
    if level == 2:  # each end of a long text
        assert received["prompt"].startswith("p" * 1000) and "(5,000 characters in all)" in received["prompt"]
        assert len(ended["output"]) < 2100 and ended["output"].endswith("o" * 1000)
    if level == 3:
        assert (received["prompt"], ended["output"]) == ("p" * 5000, "o" * 3000)


def test_text_lines_errors_and_aborts(caplog):
    log = RequestLog(enabled=True, level=0)
    failed = _state("bad")
    failed.error, failed.error_status, failed.finished_reason = "The server is shutting down.", 503, None
    lines = _logged(caplog, log, failed, SamplingParams())
    assert lines[0] == "request bad received: prompt_tokens=10"
    assert lines[1].startswith("request bad ended: error='The server is shutting down.', status=503, prompt_tokens=10")
    caplog.clear()
    gone = _state("gone")
    with caplog.at_level(logging.INFO, logger="forkserve.requests"):
        log.received(gone, PROMPT_IDS, SamplingParams())
        log.ended(gone, "aborted: the client went away")
    assert "request gone ended: ended='aborted: the client went away'" in caplog.records[-1].getMessage()
    caplog.clear()
    whole = ReqState("whole", 10, False, 0, "whole#0")  # not streamed: its tokens come at its end
    with caplog.at_level(logging.INFO, logger="forkserve.requests"):
        RequestLog(enabled=True, level=2).received(whole, PROMPT_IDS, SamplingParams())
        whole.log_end = True
        RequestLog(enabled=True, level=2).ended(whole, "aborted: the client went away")
    line = caplog.records[-1].getMessage()  # what it had made when its client left is not known here
    assert "completion_tokens" not in line and "output" not in line and "first_token_s" not in line, line


def test_nothing_is_written_when_off_or_for_a_request_that_arrived_while_off(caplog):
    log, state = RequestLog(), _state()
    assert _logged(caplog, log, state, SamplingParams()) == []
    log.configure(enabled=True)
    with caplog.at_level(logging.INFO, logger="forkserve.requests"):
        log.ended(state)  # its arrival was not logged: neither is its end
    assert not caplog.records


@pytest.mark.slow
def test_a_server_logs_requests_and_configure_logging_changes_it():
    from runtime.server.server_process import ServerProcess

    proc = ServerProcess("--log-requests", "--log-requests-level", "1", "--max-total-tokens", "4096").wait_ready()
    try:
        chat = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                "temperature": 0}
        assert httpx.post(proc.url + "/v1/chat/completions", json=chat, timeout=60).status_code == 200
        for bad, field in (({"log_requests_level": 7}, "log_requests_level"), ({"log_level": "loud"}, "log_level"),
                           ({"log_requests_format": "xml"}, "log_requests_format"),
                           ({"crash_dump_folder": "/tmp/x"}, "crash_dump_folder")):
            resp = httpx.post(proc.url + "/configure_logging", json=bad, timeout=10)
            assert resp.status_code == 400 and resp.json()["error"]["param"] == field, resp.text
        resp = httpx.post(proc.url + "/configure_logging", json={"log_requests_format": "json", "log_requests_level": 3,
                                                                 "log_level": "info", "dump_requests_folder": None})
        assert resp.status_code == 200
        gen = {"text": "The sky is", "sampling_params": {"max_new_tokens": 2, "temperature": 0}, "rid": "mine"}
        out = httpx.post(proc.url + "/generate", json=gen, timeout=60).json()
        assert httpx.post(proc.url + "/configure_logging", json={"log_requests": False}).status_code == 200
        httpx.post(proc.url + "/generate", json={**gen, "rid": "unlogged"}, timeout=60)
        time.sleep(0.5)
    finally:
        proc.stop()
    output = proc.read_output()
    text_lines = [line for line in output.splitlines() if "[forkserve http] request " in line]
    assert any(" received: prompt_tokens=" in line and "sampling_params={'max_new_tokens': 3" in line for line in text_lines)
    assert any("ended: finish_reason={'type': 'length', 'length': 3}" in line for line in text_lines), output
    events = [json.loads(line) for line in output.splitlines() if line.startswith("{")]  # JSON lines: objects alone
    received = next(e for e in events if e["event"] == "request.received" and e["rid"] == "mine")
    assert received["prompt"] == "The sky is"  # level 3: all of it
    ended = next(e for e in events if e["event"] == "request.ended" and e["rid"] == "mine")
    assert ended["output"] == out["text"] and ended["completion_tokens"] == 2
    assert "unlogged" not in output and "health-" not in output  # off again; health probes never


@pytest.mark.slow
def test_log_level_sets_what_each_process_logs_and_requests_are_logged_when_asked():
    """At debug the scheduler writes a line per step and, at info, one every
    --log-stats-interval seconds that saw work; at warning neither, while --log-requests lines
    are still written (they were asked for)."""
    from runtime.server.server_process import ServerProcess

    gen = {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}
    outputs = {}
    for level in ("debug", "warning"):
        proc = ServerProcess("--log-requests", "--log-level", level, "--max-total-tokens", "4096",
                             "--log-stats-interval", "1").wait_ready()
        try:
            assert httpx.post(proc.url + "/generate", json=gen, timeout=60).status_code == 200
            time.sleep(2)  # the periodic line comes when its second ends
        finally:
            proc.stop()
        outputs[level] = proc.read_output()
    assert "[forkserve scheduler] step: prefill" in outputs["debug"]
    assert re.search(r"\[forkserve scheduler\] last [12] s: ", outputs["debug"]), outputs["debug"]
    assert "[forkserve scheduler]" not in outputs["warning"], outputs["warning"]
    for output in outputs.values():
        assert " received: prompt_tokens=" in output and " ended: finish_reason=" in output


@pytest.mark.slow
def test_configure_logging_reaches_the_tensor_parallel_ranks():
    """``POST /configure_logging``'s level goes to every process, the ranks of ``--tp-size``
    too (each says so in its own line)."""
    from runtime.server.server_process import ServerProcess

    proc = ServerProcess("--tp-size", "2", "--max-total-tokens", "2048").wait_ready()
    try:
        assert httpx.post(proc.url + "/configure_logging", json={"log_level": "debug"}, timeout=30).status_code == 200
        gen = {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(proc.url + "/generate", json=gen, timeout=60).status_code == 200
    finally:
        proc.stop()
    output = proc.read_output()
    assert "[forkserve tp rank 1] log level set to debug" in output, output[-3000:]
    assert "[forkserve scheduler] step: prefill" in output  # the scheduler's own, now at debug
