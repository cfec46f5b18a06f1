"""The prefill step's budget (``runtime/scheduler/prefill_budget.py``): the limits the
scheduler asks about while it picks a step's prompts, and the measured prefill rate that
sizes a step holding running requests (``--max-decode-stall-ms``). The scheduler's behaviour
under them is checked end to end here (the time cap), in test_slot_bookkeeping.py,
test_scheduler_fairness.py and test_mixed_chunk.py."""

from __future__ import annotations

import pytest

from runtime.sampling.params import SamplingParams
from runtime.scheduler.prefill_budget import (
    MIN_TIMED_TOKENS,
    RESERVE_CAP_PER_REQ,
    PrefillBudget,
    PrefillRate,
)
from runtime.scheduler.req import Req


def test_the_chunk_size_limits_the_tokens_and_a_mixed_step_gives_the_running_requests_theirs():
    assert PrefillBudget.for_step(512, 64, 10, mixed=False, reserve=0).tokens == 512
    assert PrefillBudget.for_step(512, 64, 10, mixed=True, reserve=0).tokens == 502
    assert PrefillBudget.for_step(8, 64, 10, mixed=True, reserve=0).tokens == 1  # never nothing
    assert PrefillBudget.for_step(0, 64, 0, mixed=False, reserve=0).tokens >= 1 << 62  # 0: no chunking
    budget = PrefillBudget.for_step(512, 64, 10, mixed=False, reserve=0)
    assert budget.chunk(300) == 300
    budget.take(300)
    assert budget.chunk(300) == 212
    budget.take(212)
    assert budget.exhausted


def test_the_running_requests_and_each_joining_one_take_a_row():
    budget = PrefillBudget.for_step(10_000, 4, 2, mixed=False, reserve=0)
    budget.take(10)
    assert not budget.exhausted
    budget.take(10)
    assert budget.exhausted and budget.tokens == 9_980


def test_a_prompt_fits_only_if_the_decode_reserve_stays_free():
    budget = PrefillBudget.for_step(512, 64, 1, mixed=False, reserve=100.0)
    assert budget.leaves_reserve(free_slots=150, n=50)
    assert not budget.leaves_reserve(free_slots=149, n=50)
    budget.take(50, PrefillBudget.expected_decode_tokens(200, 0.5))
    assert budget.reserve == 200.0
    assert PrefillBudget.expected_decode_tokens(10**6, 1.0) == RESERVE_CAP_PER_REQ


def test_the_rate_is_an_average_of_the_steps_worth_timing():
    rate = PrefillRate()
    assert rate.tokens_within(0.25) is None  # nothing measured: no time cap yet
    rate.observe(MIN_TIMED_TOKENS - 1, 0.001)  # too thin a step to tell the rate
    rate.observe(512, 0.0)
    assert rate.tokens_per_s == 0.0
    rate.observe(400, 1.0)
    assert rate.tokens_per_s == 400.0 and rate.tokens_within(0.25) == 100
    rate.observe(800, 1.0)  # the newest step weighs a quarter
    assert rate.tokens_per_s == 500.0
    assert rate.tokens_within(0.01) == MIN_TIMED_TOKENS  # never thinner than that


def test_the_time_cap_binds_only_while_requests_run_and_never_below_its_floor():
    assert PrefillBudget.for_step(512, 64, 0, mixed=False, reserve=0, timed=100).tokens == 512  # nothing decodes
    assert PrefillBudget.for_step(512, 64, 3, mixed=False, reserve=0, timed=100).tokens == 100
    assert PrefillBudget.for_step(512, 64, 3, mixed=True, reserve=0, timed=100).tokens == 97  # the decodes' share
    assert PrefillBudget.for_step(512, 64, 60, mixed=True, reserve=0, timed=100).tokens == MIN_TIMED_TOKENS
    assert PrefillBudget.for_step(48, 64, 3, mixed=True, reserve=0, timed=100).tokens == 45  # the chunk size still caps
    assert PrefillBudget.for_step(512, 64, 3, mixed=True, reserve=0, timed=None).tokens == 509


def _prompt_chunks(model_dir, stall_ms: float) -> tuple[list[int], list[int], list[int]]:
    """A prompt prefilled alone, then another arriving while a request decodes, at a prefill
    rate held at 400 tokens/s: the prompt tokens of each prefill step of the first and of the
    second, and the decoding request's output."""
    from runtime.engine import Engine

    engine = Engine(str(model_dir), dtype="float32", chunked_prefill_size=256, max_total_tokens=4000,
                    max_decode_stall_ms=stall_ms)
    try:
        sched = engine.scheduler
        sched.prefill_rate = PrefillRate(tokens_per_s=400.0, weight=0.0)  # 100 tokens in 250 ms, held there
        steps: list[int] = []
        scheduled = sched._prefill_batch

        def recording():
            batch = scheduled()
            if batch is not None and not batch.decodes_only:
                steps.append(len(batch.input_ids) - batch.num_mixed_decodes)
            return batch

        sched._prefill_batch = recording

        def run_until_done(req: Req) -> list[int]:
            sched.add_request(req)
            first = len(steps)
            while not req.is_finished:
                sched.step()
            return steps[first:]

        alone = run_until_done(Req("alone", list(range(100, 400)), SamplingParams(max_new_tokens=1)))
        runner = Req("runner", list(range(500, 510)), SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True))
        sched.add_request(runner)
        sched.step()  # its prefill: it decodes from now on
        beside = run_until_done(Req("beside", list(range(600, 900)), SamplingParams(max_new_tokens=1)))
        while sched.has_work:
            sched.step()
        sched.check_invariants()
        return alone, beside, runner.output_ids
    finally:
        engine.shutdown()


def test_a_prompt_arriving_while_a_request_decodes_is_prefilled_in_steps_of_the_stall_time(tiny_gqa_llama):
    alone, beside, output = _prompt_chunks(tiny_gqa_llama, 250)
    assert alone == [256, 44]  # nothing decoding: whole chunks
    assert beside == [99, 99, 99, 3]  # 100 tokens' time, less the running request's
    alone_off, beside_off, output_off = _prompt_chunks(tiny_gqa_llama, 0)
    assert alone_off == [256, 44] and beside_off == [255, 45]
    assert output == output_off  # the steps' sizes change no token


def test_a_negative_stall_is_refused():
    from runtime.config import ServerArgs

    with pytest.raises(ValueError, match="max_decode_stall_ms"):
        ServerArgs(model_path="x", max_decode_stall_ms=-1.0)
