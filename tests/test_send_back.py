"""Sending requests back to the queue (``runtime/scheduler/send_back.py``): who goes, what
they keep, what each reason counts and how the decode reserve's ratio moves."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.sampling.params import SamplingParams
from runtime.scheduler.prefill_budget import RESERVE_CAP_PER_REQ
from runtime.scheduler.req import Req
from runtime.scheduler.send_back import (
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY,
    SendBack,
    least_progress,
)
from runtime.scheduler.waiting_queue import WaitingQueue


def _req(rid: str, prompt: int, outputs: int, max_new_tokens: int = 16) -> Req:
    req = Req(rid, list(range(prompt)), SamplingParams(max_new_tokens=max_new_tokens))
    req.output_ids = [7] * outputs
    req.input_token_logprobs = [-0.5] * prompt
    return req


def _send_back() -> tuple[SendBack, list[Req], WaitingQueue]:
    released: list[Req] = []
    waiting = WaitingQueue()
    return SendBack(SimpleNamespace(release=released.append), waiting), released, waiting  # type: ignore[arg-type]


def test_the_least_output_goes_first_and_at_equal_output_the_longer_prompt():
    a, b, c = _req("a", 100, 3), _req("b", 50, 1), _req("c", 20, 1)
    assert least_progress([a, b, c]) is b
    assert least_progress([a, c]) is c


def test_for_memory_releases_puts_first_counts_and_resets_the_ratio():
    send, released, waiting = _send_back()
    waiting.append(_req("arrived", 4, 0))
    for _ in range(100):
        send.decay()
    assert send.new_token_ratio == pytest.approx(INIT_NEW_TOKEN_RATIO - 100 * NEW_TOKEN_RATIO_DECAY)
    running = _req("running", 8, 2)
    send.for_memory(running)
    assert released == [running] and next(iter(waiting)) is running
    assert running.is_retracted and not running.yielded
    assert running.input_token_logprobs == [-0.5] * 8  # its prompt was done: kept
    assert (send.num_retractions, send.num_rows_yielded) == (1, 0)
    assert send.new_token_ratio == INIT_NEW_TOKEN_RATIO


def test_a_row_yielded_keeps_the_ratio_and_a_prompt_part_way_loses_its_logprobs():
    send, released, waiting = _send_back()
    send.decay()
    part_way = _req("part-way", 8, 0)
    send.yielding_row(part_way)
    assert released == [part_way] and part_way.is_retracted and part_way.yielded
    assert part_way.input_token_logprobs == []  # computed again when it comes back
    assert (send.num_retractions, send.num_rows_yielded) == (0, 1)
    assert send.new_token_ratio == pytest.approx(INIT_NEW_TOKEN_RATIO - NEW_TOKEN_RATIO_DECAY)


def test_the_ratio_stops_at_its_floor_and_scales_the_reserve():
    send, _, _ = _send_back()
    for _ in range(10_000):
        send.decay()
    assert send.new_token_ratio == MIN_NEW_TOKEN_RATIO
    reqs = [_req("short", 4, 6, max_new_tokens=16), _req("long", 4, 0, max_new_tokens=10 * RESERVE_CAP_PER_REQ)]
    assert send.decode_reserve(reqs) == MIN_NEW_TOKEN_RATIO * (10 + RESERVE_CAP_PER_REQ)
    assert send.expected_decode_tokens(reqs[0]) == MIN_NEW_TOKEN_RATIO * 16
