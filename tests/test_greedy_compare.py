"""The comparison rules the GPU end-to-end tests use (tests/gpu/greedy_compare.py)."""

from __future__ import annotations

import pytest

from tests.gpu.greedy_compare import (
    agreed_prefix,
    near_tie_position,
    prompt_logprob_diffs,
    within_bf16_noise,
)


def _output(ids, gaps=None, prompt_lps=(None, -1.0, -2.0)):
    gaps = gaps or [5.0] * len(ids)
    return {
        "output_ids": ids,
        "meta_info": {
            "output_top_logprobs": [[[-0.1, t, None], [-0.1 - g, t + 1, None]] for t, g in zip(ids, gaps, strict=True)],
            "input_token_logprobs": [[lp, 7, None] for lp in prompt_lps],
        },
    }


def test_tokens_must_agree_before_the_first_near_tie():
    ref = _output([1, 2, 3, 4], gaps=[3.0, 2.0, 0.2, 4.0])
    assert near_tie_position(ref) == 2
    assert agreed_prefix(ref, _output([1, 2, 3, 4]))[0]
    assert agreed_prefix(ref, _output([1, 2, 9, 9]))[0]  # parted at the near-tie: allowed
    ok, where = agreed_prefix(ref, _output([1, 8, 3, 4]))
    assert not ok and "first difference at 1" in where


def test_near_ties_of_the_float32_reference_count_too():
    bf16 = _output([1, 2, 3], gaps=[0.5, 3.0, 3.0])  # rounding widened the first gap to 0.5
    exact = _output([1, 2, 3], gaps=[0.34, 3.0, 3.0])
    flipped = _output([2, 2, 3])
    assert not agreed_prefix(bf16, flipped)[0]
    assert agreed_prefix(bf16, flipped, exact=exact)[0]


def test_prompt_logprob_distance_is_judged_against_bf16_noise():
    ref, other = _output([1], prompt_lps=(None, -10.0, -20.0)), _output([1], prompt_lps=(None, -10.5, -20.1))
    assert prompt_logprob_diffs(ref, other) == pytest.approx((0.5, 0.3))
    assert within_bf16_noise((0.5, 0.3), baseline=(0.3, 0.2))
    assert not within_bf16_noise((5.0, 0.3), baseline=(0.3, 0.2))
    assert not within_bf16_noise((0.5, 0.6), baseline=(0.3, 0.2))
