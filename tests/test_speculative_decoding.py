"""Speculative decoding by prompt lookup (``--speculative-algorithm NGRAM``): greedy outputs
are those of plain decoding (the shared ``engine`` fixture, same settings, is the oracle),
drafts are really checked and accepted, stops inside an accepted run cut it where plain
decoding stops, requests that cannot speculate are untouched beside ones that do, and the
KV pool's accounting holds after drafts' rejected slots are given back."""

from __future__ import annotations

import pytest

from runtime.engine import Engine

# Prompts whose answers repeat their own text or the prompt's, so that lookups find drafts.
QUESTIONS = [
    "Repeat this list exactly three times: apple, banana, cherry, date, elderberry, fig, grape.",
    "Count from 1 to 30, separated by commas.",
    "Write a Python function that adds two numbers, then write it again with type hints.",
    "What is the capital of France? Answer in one sentence.",
]


def _chat(engine: Engine, question: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": question}])


@pytest.fixture(scope="module")
def speculating(model_dir):
    eng = Engine(str(model_dir), dtype="float32", max_total_tokens=40_000, chunked_prefill_size=256,
                 speculative_algorithm="ngram", speculative_num_draft_tokens=5)
    eng.scheduler.speculator.fixed_threshold = 0.0  # every draft found is checked, whatever this machine's costs
    yield eng
    eng.shutdown()


def _accepted(eng: Engine) -> tuple[int, int]:
    stats = eng.scheduler.stats()
    return stats["spec_draft_tokens"], stats["spec_accepted_tokens"]


def test_greedy_outputs_are_those_of_plain_decoding(engine, speculating):
    prompts = [_chat(engine, q) for q in QUESTIONS]
    # odd lengths: a draft must stop short of max_new_tokens
    params = [{"temperature": 0, "max_new_tokens": n} for n in (61, 47, 80, 30)]
    drafted0, accepted0 = _accepted(speculating)
    ours = speculating.generate(prompts, params)
    plain = engine.generate(prompts, params)
    drafted, accepted = _accepted(speculating)
    assert accepted - accepted0 >= 10, "drafts were not accepted"
    assert drafted - drafted0 > accepted - accepted0
    for a, b in zip(ours, plain, strict=True):
        assert a["output_ids"] == b["output_ids"]
        assert a["text"] == b["text"]
        assert a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]
    assert speculating.scheduler.stats()["avg_spec_accept_length"] > 1
    speculating.scheduler.check_invariants()


def _generate_recording_checks(engine: Engine, prompt: str, params: dict) -> tuple[dict, list[tuple[int, int]]]:
    """The output, and for each checked draft (output tokens before it, tokens it added)."""
    speculator = engine.scheduler.speculator
    checks: list[tuple[int, int]] = []
    accepted = speculator.accepted

    def recording(req, picks):
        added = accepted(req, picks)
        checks.append((len(req.output_ids), len(added)))
        return added

    speculator.accepted = recording
    try:
        return engine.generate(prompt, params), checks
    finally:
        del speculator.accepted


def _stop_inside_a_check(engine: Engine, speculating: Engine, kind: str) -> tuple[str, dict]:
    """A prompt and a stop on a token that a check added with more after it: the first such
    token not seen earlier in the output (as a string: its text with the token before)."""
    decode = engine.tokenizer.decode
    for question in QUESTIONS:
        prompt = _chat(engine, question)
        free, checks = _generate_recording_checks(speculating, prompt, {"temperature": 0, "max_new_tokens": 60})
        ids = free["output_ids"]
        for before, added in checks:
            for p in range(max(before, 1), before + added - 1):  # not a check's last token
                if kind == "stop-token" and ids[p] not in ids[:p]:
                    return prompt, {"stop_token_ids": [ids[p]]}
                text = decode(ids[p - 1 : p + 1])
                if (kind == "stop-string" and text.strip() and text not in decode(ids[:p])
                        and decode(ids[: p + 1]).endswith(text)):
                    return prompt, {"stop": [text]}
    raise AssertionError("no checked draft kept tokens past one to stop inside")


@pytest.mark.parametrize("kind", ["stop-string", "stop-token"])
def test_a_stop_inside_an_accepted_run_ends_the_output_where_plain_decoding_does(engine, speculating, kind):
    prompt, stop = _stop_inside_a_check(engine, speculating, kind)
    params = {"temperature": 0, "max_new_tokens": 60, **stop}
    ours, checks = _generate_recording_checks(speculating, prompt, params)
    before, added = checks[-1]
    assert len(ours["output_ids"]) - before < added, "the stop did not come inside a checked draft's tokens"
    plain = engine.generate(prompt, params)
    assert ours["meta_info"]["finish_reason"]["type"] == "stop"
    assert ours["output_ids"] == plain["output_ids"] and ours["text"] == plain["text"]
    assert ours["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]


def test_requests_that_cannot_speculate_run_as_before_beside_ones_that_do(engine, speculating):
    prompt = _chat(engine, QUESTIONS[0])
    params = [
        {"temperature": 0, "max_new_tokens": 40},  # speculates
        {"temperature": 0.8, "seed": 7, "max_new_tokens": 40},  # samples: one token a step
        {"temperature": 0, "max_new_tokens": 40, "frequency_penalty": 0.5},  # reads its logits' row
    ]
    ours = speculating.generate([prompt] * 3, params)
    plain = engine.generate([prompt] * 3, params)
    for a, b in zip(ours, plain, strict=True):
        assert a["output_ids"] == b["output_ids"]
    logprobs = speculating.generate(prompt, params[0], return_logprob=True)  # asks for logprobs: no drafts
    assert logprobs["output_ids"] == ours[0]["output_ids"]
    assert len(logprobs["meta_info"]["output_token_logprobs"]) == len(ours[0]["output_ids"])


@pytest.mark.parametrize(("tight_pool", "measured"), [(False, False), (True, False), (False, True)],
                         ids=["roomy", "tight", "measured-cost"])
def test_drafts_in_prefill_steps_and_under_memory_pressure_keep_tokens_and_accounting(model_dir, tight_pool, measured):
    """Small prefill chunks mix running requests (with drafts) into prefill steps; a tight
    pool sends requests back to the queue; with the measured cost, drafts are cut as a
    server cuts them. Plain decoding with the same settings is the oracle."""
    outputs, stats, mixed = [], [], []
    for speculative in ({}, {"speculative_algorithm": "NGRAM"}):
        eng = Engine(str(model_dir), dtype="float32", chunked_prefill_size=32,
                     max_total_tokens=140 if tight_pool else 4000, **speculative)
        if eng.scheduler.speculator is not None and not measured:
            eng.scheduler.speculator.fixed_threshold = 0.0
        scheduled = eng.scheduler._prefill_batch

        def recording(scheduled=scheduled):
            batch = scheduled()
            if batch is not None and batch.draft_lens:
                mixed.append(sum(batch.draft_lens))
            return batch

        eng.scheduler._prefill_batch = recording
        try:
            prompts = [_chat(eng, q) for q in [*QUESTIONS, "List the days of the week twice."]]
            params = [{"temperature": 0, "max_new_tokens": n} for n in (50, 40, 45, 20, 35)]
            outputs.append(eng.generate(prompts, params))
            eng.scheduler.check_invariants()
            stats.append(eng.scheduler.stats())
        finally:
            eng.shutdown()
    assert stats[1]["spec_accepted_tokens"] > 0
    assert mixed or measured, "no prefill step carried a running request's draft"
    if tight_pool:
        assert stats[1]["num_retractions"] > 0
    for a, b in zip(*outputs, strict=True):
        assert a["output_ids"] == b["output_ids"]


def test_only_ngram_is_offered():
    from runtime.config import ServerArgs

    with pytest.raises(ValueError, match="only NGRAM"):
        ServerArgs(speculative_algorithm="EAGLE")
    with pytest.raises(ValueError, match="1 <= min <= max"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_ngram_min_match_window_size=4)
    with pytest.raises(ValueError, match="at least 1"):
        ServerArgs(speculative_num_draft_tokens=0)


def test_the_step_cost_fit_tells_memory_bound_steps_from_compute_bound_ones():
    from runtime.scheduler.speculation import StepCost

    def fitted(fixed: float, per_request: float, per_draft: float) -> StepCost:
        cost = StepCost()
        for i in range(40):
            requests, drafted = 1 + i % 8, (i * 3) % 11 if i % 3 else 0
            cost.observe(requests, drafted, fixed + per_request * requests + per_draft * drafted)
        return cost

    # reading the weights dominates: a draft token costs a tenth of a token of a 4-request step
    assert fitted(0.020, 0.0005, 0.0005).threshold(4) == pytest.approx(0.0005 / (0.022 / 4))
    # arithmetic dominates: a draft token costs what a request's token does
    assert fitted(0.0, 0.010, 0.010).threshold(4) == pytest.approx(1.0)
    assert StepCost().threshold(4) == 0.25  # nothing measured yet
    assert StepCost().drafts_pay(4, 8, 0.1)

    # one request all along (its fixed and per-request costs are one): still fitted
    alone = StepCost()
    for i in range(40):
        drafted = i % 5
        alone.observe(1, drafted, 0.030 + 0.001 * drafted)
    assert alone.threshold(1) == pytest.approx(0.001 / 0.030)
    # too few steps without drafts: the fit waits (and the speculator makes some)
    few_plain = StepCost()
    for i in range(40):
        few_plain.observe(1 + i % 8, 1 + i % 3, 0.03)
    assert few_plain.wants_plain_steps() and few_plain.fit() is None
    # noise that makes a draft token free is no fit
    free = StepCost()
    for i in range(40):
        free.observe(1 + i % 8, i % 2, 0.03 + 0.001 * (1 + i % 8) - 0.001 * (i % 2))
    assert free.fit() is None and free.threshold(4) == 0.25

    # a step that checks drafts runs as an extend, here 3 ms a request dearer than a decode step
    switching = StepCost()
    for i in range(40):
        requests, drafted = 1 + i % 8, (i * 3) % 11 if i % 3 else 0
        switching.observe(requests, drafted, 0.020 + 0.0005 * requests + 0.0005 * drafted + 0.003 * requests * (drafted > 0))
    per_token = (0.020 + 0.0005 * 4) / 4
    assert switching.threshold(4) == pytest.approx(0.0005 / per_token)
    assert not switching.drafts_pay(4, 2, expected=(0.0005 * 2 + 0.012) / per_token * 0.9)
    assert switching.drafts_pay(4, 2, expected=(0.0005 * 2 + 0.012) / per_token * 1.1)


def test_a_draft_is_cut_where_its_tokens_stop_paying():
    from runtime.scheduler.speculation import NgramSpeculator

    worth = NgramSpeculator._worth
    assert worth(0.9, 0.5, 6) == 6  # 0.9 ** 6 = 0.53
    assert worth(0.9, 0.6, 6) == 4  # 0.9 ** 4 = 0.66, 0.9 ** 5 = 0.59
    assert worth(0.5, 0.6, 6) == 0
    assert worth(0.3, 0.0, 6) == 6
    assert worth(1.0, 0.99, 3) == 3
