"""Comparing greedy generations from engines that compute in bfloat16.

Two correct backends round differently, so their logits differ by a little; where the
reference's top two tokens are closer than that, either choice is right and the texts may
part. ``agreed_prefix`` therefore checks token equality only up to the first such near-tie
of the reference.

The numeric check is on the prompt tokens' logprobs (the same inputs for every engine, so a
direct comparison of the logits). How far bfloat16 moves them depends on the model (a
random-weight model's logits span tens of nats), so the bound is relative: a backend in
bfloat16 must stay about as close to the float32 reference as ``torch_native`` in bfloat16
does (``within_bf16_noise``).
"""

from __future__ import annotations

from typing import Any

# Smallest gap (nats) between the reference's top two tokens at which both engines must
# still pick the same one.
NEAR_TIE = 0.5
# A backend's distance from the float32 reference may exceed torch_native-in-bfloat16's by
# this factor plus a small absolute slack (nats), for the worst token and for the mean.
NOISE_FACTOR = 2.0
MAX_SLACK, MEAN_SLACK = 0.1, 0.01


def near_tie_position(reference: dict[str, Any]) -> int:
    """Index of the first output token where the reference's top two logprobs are within
    ``NEAR_TIE`` (the output length if none is)."""
    tops = reference["meta_info"]["output_top_logprobs"]
    for i, top in enumerate(tops):
        if len(top) >= 2 and top[0][0] - top[1][0] < NEAR_TIE:
            return i
    return len(tops)


def agreed_prefix(
    reference: dict[str, Any], other: dict[str, Any], exact: dict[str, Any] | None = None
) -> tuple[bool, str]:
    """Whether ``other`` picks the reference's tokens at every position before the first
    near-tie; and a line saying where they part, for failure messages and logs.

    ``exact`` (the same prompts in float32) adds its own near-ties: bfloat16 rounding can
    widen a gap past ``NEAR_TIE`` in the reference (seen on a GPU: 0.34 nats in float32,
    0.50 in bfloat16, a tie in another backend's bfloat16)."""
    ref_ids, ids = reference["output_ids"], other["output_ids"]
    limit = near_tie_position(reference)
    if exact is not None:
        limit = min(limit, near_tie_position(exact))
    first_diff = next((i for i, (a, b) in enumerate(zip(ref_ids, ids, strict=False)) if a != b), None)
    line = f"first difference at {first_diff}, first near-tie at {limit} of {len(ref_ids)} tokens"
    return first_diff is None or first_diff >= limit, line


def prompt_logprob_diffs(reference: dict[str, Any], other: dict[str, Any]) -> tuple[float, float]:
    """(max, mean) absolute difference of the prompt tokens' logprobs."""
    a = [lp for lp, _, _ in reference["meta_info"]["input_token_logprobs"] if lp is not None]
    b = [lp for lp, _, _ in other["meta_info"]["input_token_logprobs"] if lp is not None]
    assert len(a) == len(b) and a, "prompt logprobs missing"
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return max(diffs), sum(diffs) / len(diffs)


def within_bf16_noise(got: tuple[float, float], baseline: tuple[float, float]) -> bool:
    """``got`` and ``baseline`` are (max, mean) distances from the float32 reference."""
    return got[0] <= NOISE_FACTOR * baseline[0] + MAX_SLACK and got[1] <= NOISE_FACTOR * baseline[1] + MEAN_SLACK
