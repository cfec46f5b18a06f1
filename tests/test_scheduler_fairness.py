"""Longest-prefix-first ordering must not starve a request that shares nothing cached."""

from __future__ import annotations

import pytest

from runtime.sampling.params import SamplingParams
from runtime.scheduler.req import Req

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backlog", [1, 12])
def test_lpm_does_not_starve_a_request_without_a_cached_prefix(engine, backlog):
    """A request matching the cached prefix arrives every step and would always win; with a
    backlog every waiting request is soon passed over 8 times, and those go in arrival order
    (sorted by their cached prefix again, the oldest one was starved)."""
    sched = engine.scheduler
    shared = engine.tokenizer.encode("A shared system prompt that every hot request starts with. " * 6)
    assert len(shared) >= 64
    engine.generate(input_ids=shared + [5], sampling_params={"max_new_tokens": 0})  # now cached
    loner = Req(f"loner-{backlog}", list(range(1000, 1300)), SamplingParams(max_new_tokens=1))
    sched.add_request(loner)
    steps = hot = 0
    while not loner.is_finished:
        while hot <= steps or len(sched.waiting) < backlog:  # one chunk of prefill each
            sched.add_request(Req(f"hot-{backlog}-{hot}", shared + [200 + hot] * 300, SamplingParams(max_new_tokens=1)))
            hot += 1
        sched.step()
        steps += 1
        assert steps < 40, "the request without a cached prefix was starved"
    while sched.has_work:
        sched.step()


def test_long_prompts_arriving_nonstop_do_not_stop_decoding(engine):
    sched = engine.scheduler
    runner = Req("runner", engine.tokenizer.encode("Count: one, two,"), SamplingParams(max_new_tokens=6, ignore_eos=True))
    sched.add_request(runner)
    sched.step()  # its prefill; it is running now
    assert runner in sched.running
    steps = 0
    while not runner.is_finished:
        if len(sched.waiting) < 2:  # two long prompts always waiting, each several chunks long
            sched.add_request(Req(f"long-{steps}", [300 + steps] * 900, SamplingParams(max_new_tokens=1)))
        sched.step()
        steps += 1
        assert steps < 60, "a running request never got to decode"
    while sched.has_work:
        sched.step()


def test_samples_of_a_prompt_are_prefilled_together_without_a_radix_cache(model_dir):
    """With the cache on, a sibling waits a step to reuse the prefix the first computes;
    with it off nothing is kept, and the wait only cost a step each (four steps, not one)."""
    from runtime.engine import Engine

    # chunk 512: the four copies of the prompt (~350 tokens) fit one step
    eng = Engine(str(model_dir), dtype="float32", max_total_tokens=4000, disable_radix_cache=True,
                 chunked_prefill_size=512)
    try:
        prompt = eng.tokenizer.encode("Tell me a story about a dragon and a knight. " * 8)
        eng.generate(input_ids=prompt, sampling_params={"n": 4, "max_new_tokens": 1})
        assert eng.core.stats()["num_forward_steps"] == 1
        eng.scheduler.check_invariants()
    finally:
        eng.shutdown()
