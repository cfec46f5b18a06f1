"""The engine core (``runtime/scheduler/core.py``), the one thing that steps the scheduler:
what its outputs report to the three drivers (offline engine, scheduler process, DSL
backend), checked against the requests' own final tokens."""

from __future__ import annotations

import pytest

from runtime.request_options import RequestOptions
from runtime.sampling.params import SamplingParams
from runtime.scheduler.req import Req

pytestmark = pytest.mark.slow  # the real default model

GREEDY = {"temperature": 0, "ignore_eos": True}


def _req(engine, rid: str, text: str, max_new: int, stream: bool) -> Req:
    params = SamplingParams.from_dict({**GREEDY, "max_new_tokens": max_new})
    return Req(rid, engine.tokenizer.encode(text), params, RequestOptions(stream=stream))


def _drain(core) -> list:
    outputs = []
    while core.has_work:
        outputs.extend(core.step())
    return outputs


def test_a_stream_reports_each_token_once_and_the_rest_only_their_result(engine):
    core = engine.core
    streamed, whole = _req(engine, "core-stream", "Count to ten:", 5, True), _req(engine, "core-whole", "Hi", 4, False)
    finished_before = core.num_finished
    core.add_request(streamed)
    core.add_request(whole)
    outputs = _drain(core)

    mine = [o for o in outputs if o.req is streamed]
    assert [o.start for o in mine] == [0, 1, 2, 3, 4]
    assert [t for o in mine for t in o.new_ids] == streamed.output_ids and len(streamed.output_ids) == 5
    assert [o.finished for o in mine] == [False] * 4 + [True]

    theirs = [o for o in outputs if o.req is whole]
    assert len(theirs) == 1 and theirs[0].finished and theirs[0].start == 0
    assert theirs[0].new_ids == whole.output_ids and len(whole.output_ids) == 4
    assert core.num_finished == finished_before + 2
    assert core.step() == []  # idle: nothing to report


def test_a_stream_interval_reports_the_first_token_then_every_n_and_the_end(engine, monkeypatch):
    """--stream-interval 3 on 8 tokens: reports at tokens 1, 4, 7 and the end (8); together
    they are the request's tokens, each once."""
    monkeypatch.setattr(engine.core, "stream_interval", 3)
    streamed = _req(engine, "core-interval", "Count to ten:", 8, True)
    engine.core.add_request(streamed)
    mine = [o for o in _drain(engine.core) if o.req is streamed]
    assert [(o.start, o.num_new) for o in mine] == [(0, 1), (1, 3), (4, 3), (7, 1)]
    assert [t for o in mine for t in o.new_ids] == streamed.output_ids
    assert [o.finished for o in mine] == [False, False, False, True]


def test_a_requests_own_stream_interval_wins(engine, monkeypatch):
    """vLLM's and SGLang's per-request ``stream_interval`` (it was ignored): 2 on 6 tokens
    under --stream-interval 3 reports at tokens 1, 3, 5 and the end."""
    monkeypatch.setattr(engine.core, "stream_interval", 3)
    streamed = _req(engine, "core-own-interval", "Count to ten:", 6, True)
    streamed.params.stream_interval = 2
    engine.core.add_request(streamed)
    mine = [o for o in _drain(engine.core) if o.req is streamed]
    assert [(o.start, o.num_new) for o in mine] == [(0, 1), (1, 2), (3, 2), (5, 1)]


def test_a_request_that_can_never_run_is_refused_with_its_reason(engine):
    core = engine.core
    req = _req(engine, "core-too-long", "x " * 10, 10**9, False)
    finished_before = core.num_finished
    with pytest.raises(ValueError, match="cannot fit in the KV pool") as err:
        core.add_request(req)
    assert not core.has_work
    out = core.reject(req, err.value)
    assert out.finished and out.error == str(err.value) and out.new_ids == []
    assert req.finished_reason == {"type": "abort", "message": str(err.value)}
    assert core.num_finished == finished_before + 1


def test_an_abort_reports_the_tokens_not_yet_reported_and_ends_the_request(engine):
    core = engine.core
    req = _req(engine, "core-abort", "Tell me a story.", 50, True)
    core.add_request(req)
    reported: list[int] = []
    while len(req.output_ids) < 3:
        reported += [t for o in core.step() if o.req is req for t in o.new_ids]
    (last,) = core.abort("core-abort")
    assert last.finished and req.finished_reason["type"] == "abort"
    assert reported + last.new_ids == req.output_ids
    assert core.abort("core-abort") == []  # gone
    assert not core.has_work


def test_step_accounting_counts_what_the_steps_computed(engine):
    """One uncached prompt of n tokens and k output tokens: its prompt tokens are counted
    once in prefill steps, its later tokens in decode steps (or mixed into prefill steps),
    and every step's time goes to prefill, decode or the scheduler."""
    core = engine.core
    engine.flush_cache()
    before = core.stats()
    prompt = engine.tokenizer.encode("Step accounting: count the tokens of this prompt exactly once, please.")
    req = Req("acct", prompt, SamplingParams.from_dict({**GREEDY, "max_new_tokens": 5}), RequestOptions())
    core.add_request(req)
    _drain(core)
    after = core.stats()
    delta = {k: after[k] - before[k] for k in after if k.startswith("step_")}
    assert delta["step_prefill_tokens"] == len(prompt)
    # the first output token comes from the prefill step; the other 4 from decodes (or mixed in)
    assert delta["step_decode_tokens"] + delta["step_prefill_mixed_decodes"] == 4
    assert delta["step_prefill_steps"] >= 1 and delta["step_decode_steps"] >= 1
    assert after["num_forward_steps"] - before["num_forward_steps"] == delta["step_prefill_steps"] + delta["step_decode_steps"]
    assert delta["step_prefill_seconds"] > 0 and delta["step_decode_seconds"] > 0 and delta["step_scheduler_seconds"] >= 0
