"""The three ``select`` choices methods on hand-worked logprobs (no model)."""

from __future__ import annotations

import pytest

import frontend_lang as sgl


def test_token_length_normalized_takes_the_best_mean():
    best, scores = sgl.token_length_normalized.decide([[-1.0, -3.0], [-1.5], [-0.5, -4.0]], None)
    assert best == 1 and scores == [-2.0, -1.5, -2.25]


def test_greedy_token_selection_compares_position_by_position():
    # position 0: choices 0 and 1 tie at -1; position 1: choice 1's -1.5 beats choice 0's -2
    best, _ = sgl.greedy_token_selection.decide([[-1.0, -2.0], [-1.0, -1.5, -9.0], [-3.0]], None)
    assert best == 1
    # a shorter choice counts its own mean past its end: [-1] pads to -1, beating -2
    best, _ = sgl.greedy_token_selection.decide([[-1.0, -2.0], [-1.0]], None)
    assert best == 1
    # a full tie keeps the first
    assert sgl.greedy_token_selection.decide([[-1.0], [-1.0]], None)[0] == 0


def test_unconditional_likelihood_normalized_subtracts_the_prior():
    cond, uncond = [[-1.0, -1.0], [-2.0]], [[-0.5], [-4.0]]
    best, scores = sgl.unconditional_likelihood_normalized.decide(cond, uncond)
    assert best == 1 and scores == pytest.approx([-0.5, 2.0])


def test_select_refuses_an_unknown_method():
    with pytest.raises(ValueError, match="choices_method"):
        sgl.select("x", ["a", "b"], choices_method="greedy")


def test_select_takes_any_iterable_of_choices_and_refuses_an_empty_one():
    assert sgl.select("x", (c for c in [" Paris", " Rome"])).choices == [" Paris", " Rome"]
    with pytest.raises(ValueError, match="empty choice"):  # it scored -inf, or failed the server's request
        sgl.select("x", ["", " Paris"])
    with pytest.raises(ValueError, match="non-empty list"):
        sgl.select("x", "Paris")
