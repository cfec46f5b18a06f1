"""``SamplingParams.from_dict``: defaults, normalisation, and a ValueError naming the field
for each bad value."""

from __future__ import annotations

import pytest

from runtime.request_options import RequestOptions
from runtime.sampling.params import InvalidField, SamplingParams


def test_from_dict_defaults_and_normalisation():
    p = SamplingParams.from_dict(None)
    assert p == SamplingParams()
    p = SamplingParams.from_dict({"stop": "###", "temperature": None, "max_new_tokens": 0})
    assert p.stop == ["###"] and p.temperature == 1.0 and p.max_new_tokens == 0
    assert SamplingParams.from_dict({"temperature": 0}).is_greedy
    assert SamplingParams.from_dict({"top_k": 1}).is_greedy
    assert not SamplingParams.from_dict({"temperature": 0.5}).is_greedy
    assert SamplingParams.from_dict({"top_k": 0}).top_k == -1  # off, as vLLM and transformers read 0
    assert SamplingParams.from_dict({"top_k": 2**64}).top_k == -1  # the scheduler died on it (int64 overflow)


@pytest.mark.parametrize(
    ("bad", "field_name"),
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, "max_new_tokens"),
        ({"max_new_tokens": "8"}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"min_new_tokens": -2}, "min_new_tokens"),
        ({"min_new_tokens": 5, "max_new_tokens": 4}, "min_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": 1e-300}, "repetition_penalty"),
        ({"repetition_penalty": 1e300}, "repetition_penalty"),
        ({"temperature": 1e39}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"n": 129}, "n"),
        ({"ignore_eos": "false"}, "ignore_eos"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
        ({"spaces_between_special_tokens": 1}, "spaces_between_special_tokens"),
        ({"no_stop_trim": 0}, "no_stop_trim"),
        ({"stop": [1, 2]}, "stop"),
        ({"stop": 7}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop": ["ok", None]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": ["2"]}, "stop_token_ids"),
        ({"seed": 1.5}, "seed"),
        ({"n": 0}, "n"),
        ({"regex": 5}, "regex"),
        ({"json_schema": 3}, "json_schema"),
        ({"ebnf": ""}, "ebnf"),
        ({"temprature": 0.5}, "temprature"),
        ({"max_tokens": 5}, "max_tokens"),
    ],
    ids=lambda x: repr(x) if isinstance(x, dict) else None,
)
def test_from_dict_rejects_bad_values_naming_the_field(bad, field_name):
    with pytest.raises(ValueError, match=rf"(?<![A-Za-z_]){field_name}(?![A-Za-z_])"):
        SamplingParams.from_dict(bad)


def test_invalid_field_survives_pickling():
    import pickle

    from runtime.sampling.params import InvalidField

    err = pickle.loads(pickle.dumps(InvalidField("top_p", "top_p must be in (0, 1]")))
    assert isinstance(err, ValueError) and err.field == "top_p" and str(err) == "top_p must be in (0, 1]"


def test_stop_token_ids_must_be_in_the_vocabulary():
    from runtime.sampling.params import InvalidField

    p = SamplingParams.from_dict({"stop_token_ids": [3, 49152]})
    p.check_vocab(49153)
    with pytest.raises(InvalidField, match="stop_token_ids") as err:
        p.check_vocab(49152)
    assert err.value.field == "stop_token_ids"


def test_the_extreme_allowed_values_sample_finite_probabilities():
    """At the bounds validate() allows, sampling with EOS banned (min_new_tokens) still
    draws a token: no inf or NaN reaches torch.multinomial."""
    import torch

    from runtime.sampling.params import MAX_TEMPERATURE, REPETITION_PENALTY_RANGE
    from runtime.sampling.sampler import sample

    class Req:
        input_ids, output_ids, generator, options, allowed = [1, 2, 3], [4], None, RequestOptions(), None

    logits = torch.randn(4, 50) * 30
    reqs = []
    for temperature, penalty in [(MAX_TEMPERATURE, 1.0), (1e-5, REPETITION_PENALTY_RANGE[0]),
                                 (1.0, REPETITION_PENALTY_RANGE[1]), (MAX_TEMPERATURE, REPETITION_PENALTY_RANGE[0])]:
        r = Req()
        r.params = SamplingParams.from_dict({"temperature": temperature, "repetition_penalty": penalty})
        reqs.append(r)
    out = sample(logits, reqs, [[0, 7]] * 4, torch.Generator().manual_seed(0))
    assert all(0 <= t < 50 and t not in (0, 7) for t in out.next_ids)


def test_unknown_names_are_an_error_offline_and_reported_when_the_caller_asks():
    from runtime.sampling.params import InvalidField

    with pytest.raises(ValueError, match="max_new_token"):
        SamplingParams.from_dict({"max_new_token": 4})
    seen: list[str] = []
    p = SamplingParams.from_dict({"max_new_tokens": 4, "wibble": 1, "zap": None}, seen.append)
    assert p.max_new_tokens == 4 and seen == ["wibble", "zap"]
    assert SamplingParams.from_dict({"sampling_seed": 3}).seed == 3  # SGLang's name
    assert SamplingParams.from_dict({"logit_bias": {}, "custom_params": None}) == SamplingParams()
    with pytest.raises(InvalidField) as err:
        SamplingParams.from_dict({"custom_params": {"a": 1}}, seen.append)
    assert err.value.field == "custom_params"


def test_logit_bias_keys_are_token_ids_and_values_within_openais_range():
    assert SamplingParams.from_dict({"logit_bias": {"50": -100, 7: 2.5}}).logit_bias == {50: -100, 7: 2.5}
    assert SamplingParams.from_dict({"logit_bias": {" 5 ": 1}}).logit_bias == {5: 1}
    for bad in ({"x": 1}, {"-1": 1}, {"--5": 1}, {"\u00b2": 1}, {"5": 100.5}, {"5": "high"}, [5],
                {"5": 1, " 5": -100}, {5: 1, "5": 2}):
        with pytest.raises(InvalidField) as err:
            SamplingParams.from_dict({"logit_bias": bad})
        assert err.value.field == "logit_bias", bad
    with pytest.raises(InvalidField, match="vocabulary"):
        SamplingParams.from_dict({"logit_bias": {"100": 1}}).check_vocab(100)
    # the message names the entry at fault: the key, or the value
    with pytest.raises(InvalidField, match=r"keys must be token ids .*got '-1'"):
        SamplingParams.from_dict({"logit_bias": {"-1": 5}})
    with pytest.raises(InvalidField, match=r"logit_bias\[5\] must be a number in \[-100, 100\], got 100.5"):
        SamplingParams.from_dict({"logit_bias": {"5": 100.5}})


def test_whole_floats_for_integer_fields_are_those_integers():
    params = SamplingParams.from_dict({"max_new_tokens": 3.0, "min_new_tokens": 1.0, "top_k": 5.0, "seed": 7.0, "n": 2.0})
    assert (params.max_new_tokens, params.min_new_tokens, params.top_k, params.seed, params.n) == (3, 1, 5, 7, 2)
    assert all(type(v) is int for v in (params.max_new_tokens, params.top_k, params.seed, params.n))
