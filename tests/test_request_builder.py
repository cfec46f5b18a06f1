"""The one request builder (``runtime/request_builder.py``) that Engine.generate, /generate
and the OpenAI routes share: each refusal names its field, n expands prompt-major, and the
two length rules (native: the prompt must fit the context; OpenAI: prompt plus completion)."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.request_builder import (
    PartOfPrompt,
    RequestLimits,
    build_requests,
    check_lengths,
    parse_sampling_params,
    score_each_prompt_once,
)
from runtime.request_options import RequestOptions
from runtime.sampling.params import InvalidField, SamplingParams

LIMITS = RequestLimits(vocab_size=100, max_context_len=50, max_total_tokens=80)


def _build(prompts, params=None, options=RequestOptions(), **kw):  # noqa: ANN001, ANN202, B008
    params = params or [SamplingParams(max_new_tokens=5)] * len(prompts)
    return build_requests(prompts, params, options, LIMITS, prompt_field="input_ids", **kw)


def test_n_expands_prompt_major_and_every_request_carries_its_options():
    options = RequestOptions(stream=True, program_id="p")
    reqs = _build([[1, 2], [3]], [SamplingParams(n=2, max_new_tokens=5), SamplingParams(n=3, max_new_tokens=5)], options)
    assert [r.input_ids for r in reqs] == [[1, 2], [1, 2], [3], [3], [3]]
    assert all(r.options is options for r in reqs)


@pytest.mark.parametrize(("prompts", "params", "options", "field"), [
    ([[]], None, RequestOptions(), "input_ids"),
    ([[1, 100]], None, RequestOptions(), "input_ids"),
    ([[1, -1]], None, RequestOptions(), "input_ids"),
    ([[1] * 50], None, RequestOptions(), "input_ids"),  # the prompt alone reaches the context
    ([[1]], [SamplingParams(max_new_tokens=80)], RequestOptions(), "max_new_tokens"),  # beyond the context
    ([[1]], [SamplingParams(min_new_tokens=1, stop_token_ids=[100])], RequestOptions(), "stop_token_ids"),
    ([[1]], None, RequestOptions(return_logprob=True, logprob_start_len=-2), "logprob_start_len"),
    ([[1, 2]], None, RequestOptions(return_logprob=True, logprob_start_len=3), "logprob_start_len"),  # past the prompt
    ([[1]], None, RequestOptions(return_logprob=True, top_logprobs_num=101), "top_logprobs_num"),
    ([[1]], None, RequestOptions(return_logprob="yes"), "return_logprob"),
])
def test_each_refusal_names_its_field(prompts, params, options, field):
    with pytest.raises(InvalidField) as err:
        _build(prompts, params, options)
    assert err.value.field == field


def test_n_seeded_samples_get_their_own_seeds():
    reqs = _build([[1]], [SamplingParams(max_new_tokens=5, n=3, seed=7)], RequestOptions())
    assert [r.params.seed for r in reqs] == [7, 8, 9]
    assert [r.params.seed for r in _build([[1]], [SamplingParams(max_new_tokens=5, n=2)], RequestOptions())] == [None, None]


def test_the_completion_must_fit_the_context_unless_auto_truncated():
    with pytest.raises(InvalidField, match="maximum context length is 50") as err:
        check_lengths(40, 30, LIMITS)
    assert err.value.field == "max_new_tokens"
    truncating = dataclasses.replace(LIMITS, auto_truncate=True)
    check_lengths(40, 30, truncating)  # generation stops at the context
    with pytest.raises(InvalidField, match="the KV cache holds 80") as err:
        check_lengths(40, 41, dataclasses.replace(truncating, max_context_len=100))
    assert err.value.field == "max_new_tokens"
    with pytest.raises(InvalidField, match="the prompt alone has 50") as err:
        check_lengths(50, 0, truncating)
    assert err.value.field == "prompt"
    with pytest.raises(InvalidField, match="KV cache holds 80 tokens, and the prompt alone has 80") as err:
        check_lengths(80, 0, dataclasses.replace(LIMITS, max_context_len=100))  # not an empty answer
    assert err.value.field == "prompt"


def test_a_count_of_part_of_the_prompt_is_not_given_as_the_whole_prompts():
    part = PartOfPrompt([5] * 60, chars=300, end=False)
    with pytest.raises(InvalidField) as err:
        build_requests([part], [SamplingParams()], RequestOptions(), LIMITS, prompt_field="prompt")
    assert "the prompt alone is longer than that (60 tokens in its first 300 characters alone)" in str(err.value)
    assert "has 60" not in str(err.value)
    tail = PartOfPrompt([5] * 60, chars=300, end=True)
    with pytest.raises(InvalidField, match="in its last 300 characters alone"):
        build_requests([tail], [SamplingParams()], RequestOptions(), LIMITS, prompt_field="prompt")


def test_max_new_tokens_left_out_or_auto_truncated_is_cut_to_the_room_left():
    """As SGLang: a request that leaves max_new_tokens out runs to the context (its default
    is not refused); with auto_truncate a given one too, and it is then measured against
    the KV pool as what it can really use."""
    unset = SamplingParams.from_dict({})
    assert unset.max_new_tokens == 128 and unset.max_new_tokens_unset
    [req] = _build([[1] * 45], [unset])
    assert req.params.max_new_tokens == 5
    with pytest.raises(InvalidField, match="maximum context length"):
        _build([[1] * 45], [SamplingParams.from_dict({"max_new_tokens": 128})])
    pool_first = dataclasses.replace(LIMITS, max_context_len=100)  # the pool (80) is the smaller limit
    [req] = build_requests([[1] * 70], [unset], RequestOptions(), pool_first, prompt_field="input_ids")
    assert req.params.max_new_tokens == 10
    truncating = dataclasses.replace(LIMITS, auto_truncate=True, max_context_len=70)
    [req] = build_requests([[1] * 10], [SamplingParams(max_new_tokens=10**6)], RequestOptions(), truncating,
                           prompt_field="input_ids")
    assert req.params.max_new_tokens == 60


def test_sampling_params_one_for_all_or_one_each():
    shared = parse_sampling_params({"max_new_tokens": 3}, 2)
    assert [p.max_new_tokens for p in shared] == [3, 3]
    assert parse_sampling_params(None, 1)[0] == SamplingParams()
    each = parse_sampling_params([{"max_new_tokens": 1}, {"max_new_tokens": 2}], 2)
    assert [p.max_new_tokens for p in each] == [1, 2]
    for bad in ([{"max_new_tokens": 1}], [1, 2], "x"):
        with pytest.raises(InvalidField) as err:
            parse_sampling_params(bad, 2)
        assert err.value.field == "sampling_params"


def test_top_logprobs_num_is_capped_by_max_logprobs():
    """vLLM's ``--max-logprobs`` (20): 49,152 top logprobs per token took a server's memory."""
    options = RequestOptions(return_logprob=True, top_logprobs_num=21)
    with pytest.raises(InvalidField, match=r"\[0, 20\].*--max-logprobs"):
        _build([[1]], None, options)
    assert _build([[1]], None, dataclasses.replace(options, top_logprobs_num=20))
    uncapped = dataclasses.replace(LIMITS, max_logprobs=-1)
    assert build_requests([[1]], [SamplingParams(max_new_tokens=5)], dataclasses.replace(options, top_logprobs_num=100),
                          uncapped, prompt_field="input_ids")
    with pytest.raises(InvalidField, match=r"\[0, 100\] \(the vocabulary\)"):
        build_requests([[1]], [SamplingParams(max_new_tokens=5)], dataclasses.replace(options, top_logprobs_num=101),
                       uncapped, prompt_field="input_ids")


def test_only_the_first_sample_of_a_prompt_scores_it():
    """n samples asking for their prompt's logprobs: the first computes them, the others ask
    for none and report the first's; another prompt, or other options, scores its own."""
    scoring = RequestOptions(return_logprob=True, logprob_start_len=1, top_logprobs_num=2)
    n3 = SamplingParams(n=3, max_new_tokens=5)
    reqs = _build([[1, 2, 3], [1, 2, 3]], [n3, n3], scoring)  # two prompts, equal but each its own
    reqs += _build([[4, 5]], [SamplingParams(n=2, max_new_tokens=5)], [RequestOptions(return_logprob=True)])  # output only
    reqs += _build([[6, 7]], [SamplingParams(n=2, max_new_tokens=5)], [dataclasses.replace(scoring, logprob_start_len=2)])
    changed, source = score_each_prompt_once(reqs)
    assert source == [0, 0, 0, 3, 3, 3, 6, 7, 8, 9]  # the last: logprob_start_len at the prompt's end scores none
    assert [r.options.logprob_start_len for r in changed] == [1, -1, -1, 1, -1, -1, -1, -1, 2, 2]
    assert all(c.input_ids is r.input_ids and c.params is r.params for c, r in zip(changed, reqs, strict=True))
    assert all(c.options.top_logprobs_num == r.options.top_logprobs_num for c, r in zip(changed, reqs, strict=True))
