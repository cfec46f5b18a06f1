"""The scheduler's activity lines (``runtime/scheduler/activity_log.py``) on the real engine:
the periodic line's figures against the requests' own counts, the per-step lines at debug."""

from __future__ import annotations

import logging

import pytest

from runtime.scheduler.activity_log import ActivityLog

pytestmark = pytest.mark.slow


def test_the_lines_report_what_the_steps_did(engine, caplog):
    activity = ActivityLog(engine.core, interval_s=3600)
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Name a fruit."}])
    reqs, _, _ = engine.build_requests([prompt, prompt], {"max_new_tokens": 5, "ignore_eos": True})
    for req in reqs:
        engine.core.add_request(req)
    with caplog.at_level(logging.DEBUG, logger="forkserve"):
        while engine.core.has_work:
            activity.step_starting()
            activity.record(engine.core.step())
            activity.maybe_log()  # not yet: the interval has not passed
        assert not [r for r in caplog.records if "last" in r.getMessage()]
        activity._since -= 3600  # as if the interval had passed
        activity.maybe_log()
    lines = [r.getMessage() for r in caplog.records if r.name == "forkserve"]
    assert any(line.startswith("step: prefill") for line in lines) and any(line.startswith("step: decode 2 requests")
                                                                          for line in lines)
    summary = lines[-1]
    assert "; 10 tokens generated (" in summary, summary  # 2 requests x 5 tokens
    computed = sum(len(r.input_ids) - r.cached_tokens for r in reqs)
    assert f": {computed} prompt tokens computed (" in summary, summary
    cached = sum(r.cached_tokens for r in reqs) / sum(len(r.input_ids) for r in reqs)
    assert f"{cached:.0%} of the prompt tokens of 2 finished requests cached" in summary, summary
    assert not activity.pending and activity.idle_wait_ms() is None


def test_a_long_interval_waits_at_most_what_a_poll_takes(engine):
    """--log-stats-interval 1e9 (days): the idle wait for the pending line stays within a ZMQ
    poll's range (2**31 - 1 ms; beyond it the poll raises and the scheduler would die)."""
    activity = ActivityLog(engine.core, interval_s=1e9)
    activity._generated = 1  # work to report
    wait = activity.idle_wait_ms()
    assert isinstance(wait, int) and 0 < wait < 2**31
