"""The prefill step's budget (``runtime/scheduler/prefill_budget.py``): the limits the
scheduler asks about while it picks a step's prompts. The scheduler's behaviour under them
is checked end to end in test_slot_bookkeeping.py, test_scheduler_fairness.py and
test_mixed_chunk.py."""

from __future__ import annotations

from runtime.scheduler.prefill_budget import RESERVE_CAP_PER_REQ, PrefillBudget


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
