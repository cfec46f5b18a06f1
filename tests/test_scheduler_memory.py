"""KV memory held outside the running requests (a prompt part-way through its chunked
prefill, program pins, requests waiting to compute jumped tokens) must give way when the
running requests run out of slots, and jump-forward must respect the request's limits.
Outputs are compared with the same model on a pool large enough for everything."""

from __future__ import annotations

import json
import re

import pytest

from runtime.engine import Engine
from runtime.request_options import RequestOptions
from runtime.sampling.params import SamplingParams
from runtime.scheduler.req import Req
from tests.tiny_models import random_prompts

pytestmark = pytest.mark.slow


def _run_all(engine: Engine, reqs: list[Req], arrive_after: dict[str, tuple[str, int]] | None = None) -> None:
    """Step ``engine``'s scheduler until idle; a request in ``arrive_after`` is added once the
    named request has that many output tokens."""
    sched = engine.scheduler
    by_rid = {r.rid: r for r in reqs}
    pending = dict(arrive_after or {})
    for r in reqs:
        if r.rid not in pending:
            sched.add_request(r)
    steps = 0
    while sched.has_work or pending:
        for rid, (after, tokens) in list(pending.items()):
            if len(by_rid[after].output_ids) >= tokens or by_rid[after].is_finished:
                sched.add_request(by_rid[rid])
                del pending[rid]
        sched.step()
        steps += 1
        assert steps < 5000, "the scheduler made no progress"
    sched.check_invariants()
    assert sched.stats()["kv_held_by_requests"] == 0


def _greedy(max_new: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)


def _reference(model_dir, prompts: list[list[int]], max_new: list[int]) -> list[dict]:
    """Outputs with prompt logprobs from position 0, on a pool that holds everything."""
    roomy = Engine(str(model_dir), dtype="float32", max_total_tokens=8000)
    try:
        return roomy.generate(input_ids=prompts, return_logprob=True, logprob_start_len=0, sampling_params=[
            {"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in max_new])
    finally:
        roomy.shutdown()


def test_a_part_way_prefill_gives_way_to_a_decoding_request(tiny_gqa_llama):
    # A decodes until the pool is nearly full while B's long prompt is prefilled in chunks
    # beside it; B's chunks then hold the slots A needs for its next tokens. B is sent
    # back to the queue part-way through its prompt, and its prompt logprobs start over.
    long_run, late = random_prompts(3, (300, 450))
    engine = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=1000, chunked_prefill_size=128)
    try:
        a = Req("a", long_run, _greedy(650))
        b = Req("b", late, _greedy(1), RequestOptions(return_logprob=True, logprob_start_len=0))
        _run_all(engine, [a, b], arrive_after={"b": ("a", 300)})
        assert b.is_retracted, "the pool was meant to run short while B was part-way through its prompt"
    finally:
        engine.shutdown()
    assert [a.finished_reason["type"], b.finished_reason["type"]] == ["length", "length"]
    want_a, want_b = _reference(tiny_gqa_llama, [long_run, late], [650, 1])
    assert [a.output_ids, b.output_ids] == [want_a["output_ids"], want_b["output_ids"]]
    want = want_b["meta_info"]["input_token_logprobs"]
    assert [t for _, t in b.input_token_logprobs] == [t for _, t, _ in want] == late
    assert b.input_token_logprobs[0][0] is None is want[0][0]  # the first token has no logprob
    assert all(abs(x - y) < 1e-4 for (x, _), (y, _, _) in zip(b.input_token_logprobs[1:], want[1:], strict=True))


def test_program_pins_give_way_to_a_decoding_request(tiny_gqa_llama):
    # A finished program call pins ~480 of the 1,000 slots; a request that needs 900 then
    # decodes past what is left unpinned.
    program_prompt, long_run = random_prompts(4, (480, 100))
    engine = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=1000)
    try:
        call = Req("call", program_prompt, _greedy(1), RequestOptions(program_id="p"))
        _run_all(engine, [call])
        assert engine.scheduler.stats()["num_pinned_programs"] == 1
        runner = Req("runner", long_run, _greedy(800))
        _run_all(engine, [runner])
        assert engine.scheduler.stats()["num_pinned_programs"] == 0
    finally:
        engine.shutdown()
    assert runner.output_ids == _reference(tiny_gqa_llama, [long_run], [800])[0]["output_ids"]


LONG_KEY_SCHEMA = {
    "type": "object",
    "properties": {"the_answer_to_the_question_that_was_asked_of_us": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["the_answer_to_the_question_that_was_asked_of_us"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("max_new", [3, 5, 8, 12])
def test_jump_forward_never_goes_past_max_new_tokens(tiny_gqa_llama, max_new):
    engine = Engine(str(tiny_gqa_llama), dtype="float32")
    try:
        out = engine.generate(input_ids=random_prompts(5, (20,)), sampling_params={
            "temperature": 0, "max_new_tokens": max_new, "json_schema": json.dumps(LONG_KEY_SCHEMA)})[0]
        assert engine.scheduler.num_jumped_tokens > 0, "the schema's key was meant to be jumped"
    finally:
        engine.shutdown()
    assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) <= max_new
    assert out["meta_info"]["finish_reason"]["type"] == "length"


def test_a_jump_longer_than_the_chunk_size_still_runs(tiny_gqa_llama):
    engine = Engine(str(tiny_gqa_llama), dtype="float32", chunked_prefill_size=8)
    try:
        out = engine.generate(input_ids=random_prompts(6, (20,)), sampling_params={
            "temperature": 0, "max_new_tokens": 60, "json_schema": json.dumps(LONG_KEY_SCHEMA)})[0]
        assert engine.scheduler.num_jumped_tokens > 8
    finally:
        engine.shutdown()
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert list(json.loads(out["text"])) == ["the_answer_to_the_question_that_was_asked_of_us"]


def test_the_peak_of_kv_in_use_is_kept_per_step_until_a_flush(tiny_gqa_llama):
    # A polled gauge misses a burst shorter than its interval; the scheduler's own mark does
    # not. At its last step a request holds its prompt and every output but the newest.
    first, second = random_prompts(6, (40, 25))
    engine = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=1000)
    try:
        _run_all(engine, [Req("a", first, _greedy(6))])
        assert engine.scheduler.stats()["kv_peak_in_use"] == 40 + 5
        _run_all(engine, [Req("b", second, _greedy(3))])  # a lower peak leaves the mark alone
        assert engine.scheduler.stats()["kv_peak_in_use"] == 40 + 5
        assert engine.scheduler.flush_cache()
        assert engine.scheduler.stats()["kv_peak_in_use"] == 0
        _run_all(engine, [Req("c", second, _greedy(3))])
        assert engine.scheduler.stats()["kv_peak_in_use"] == 25 + 2
    finally:
        engine.shutdown()


def test_a_jumped_request_does_not_wait_behind_a_chunked_prompt(tiny_gqa_llama):
    # Each field's forced text is jumped while a 1,500-token prompt is prefilled 32 tokens a
    # step: the jumps run beside the chunks, so the constrained request finishes first
    # (it waited for every chunk before), with the output it has alone.
    pattern = r'\{"name": "[a-z]{1,6}", "age": [0-9]{1,2}, "city": "(Paris|London|Tokyo)"\}'
    short, long_prompt = random_prompts(7, (10, 1500))
    params = SamplingParams(temperature=0, max_new_tokens=60, regex=pattern)
    engine = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=4000, chunked_prefill_size=32)
    try:
        alone = Req("alone", short, params)
        _run_all(engine, [alone])
        engine.scheduler.flush_cache()
        jumped_alone = engine.scheduler.num_jumped_tokens
        sched, constrained = engine.scheduler, Req("constrained", short, params)
        sched.add_request(constrained)
        while not constrained.output_ids:
            sched.step()
        long_run = Req("long", long_prompt, _greedy(1))
        _run_all(engine, [long_run], arrive_after={})
    finally:
        engine.shutdown()
    assert engine.scheduler.num_jumped_tokens > jumped_alone > 0
    assert constrained.finished_at < long_run.finished_at
    assert constrained.output_ids == alone.output_ids and re.fullmatch(pattern, engine.tokenizer.decode(alone.output_ids))
