"""``select``: score each choice by its token logprobs after the prefix, in one batch.

1. The prefix is prefilled once (a ``max_new_tokens: 0`` request), which also tells its
   token count ``n``.
2. One batched request scores ``prefix + choice`` for every choice, with prompt logprobs
   from position ``n - 2`` (the choice's first token may merge with the prefix's last) and
   the tokens' text. The choice's tokens are those whose text reaches past the prefix
   (where a token holds part of a character, so that texts do not line up: those from the
   first that differs from the prefix's own tokens, which one more request then scores).
3. A choices method (SGLang's three) turns those logprobs into a decision:
   ``token_length_normalized`` (the default) takes the highest mean logprob;
   ``greedy_token_selection`` compares the choices token by token, keeping those with the
   best logprob at each position (a shorter choice counts its own mean past its end);
   ``unconditional_likelihood_normalized`` subtracts each choice's mean logprob without the
   prefix (one more batched request; the choice's first token, which has no logprob alone,
   counts as 0 there, as SGLang counts it), favouring what the context makes likely rather
   than what is likely anyway. Ties go to the first choice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from frontend_lang.backend.base import Backend

_LOOKBACK = 2


def choice_token_logprobs(prefix: str, choice: str, triples: list[list[Any]],
                          prefix_tail: Callable[[], list[int]]) -> list[float]:
    """Logprobs of the tokens of ``prefix + choice`` that cover part of ``choice``, from its
    scored ``triples``. Where their texts do not line up with it (a token holding part of a
    character reads as U+FFFD), the tokens from the first that differs from the prefix's own
    at the same position (``prefix_tail``: the prefix's token ids from the first scored one):
    the token that a space ending the prefix merged into stays counted, as it does for text
    that lines up."""
    texts = [t[2] or "" for t in triples]
    full = prefix + choice
    tail = "".join(texts)
    picked: list[float] = []
    if full.endswith(tail):
        offset = len(full) - len(tail)
        for (lp, _tid, _), text in zip(triples, texts, strict=True):
            offset += len(text)
            if offset > len(prefix) and lp is not None:
                picked.append(lp)
    if not picked:
        own = prefix_tail()
        first = next((i for i, (t, tid) in enumerate(zip(triples, own, strict=False)) if t[1] != tid), len(own))
        picked = [t[0] for t in triples[first:] if t[0] is not None]
    return picked


class ChoicesMethod:
    """A rule from per-choice token logprobs to the chosen index and each choice's score."""

    name = ""
    needs_unconditional = False

    def decide(self, cond: list[list[float]], uncond: list[list[float]] | None) -> tuple[int, list[float]]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("-inf")


def _first_best(scores: list[float]) -> int:
    return max(range(len(scores)), key=lambda i: scores[i])  # max keeps the first on ties


class TokenLengthNormalized(ChoicesMethod):
    name = "token_length_normalized"

    def decide(self, cond: list[list[float]], uncond: list[list[float]] | None) -> tuple[int, list[float]]:
        scores = [_mean(lps) for lps in cond]
        return _first_best(scores), scores


class GreedyTokenSelection(ChoicesMethod):
    name = "greedy_token_selection"

    def decide(self, cond: list[list[float]], uncond: list[list[float]] | None) -> tuple[int, list[float]]:
        width = max(len(lps) for lps in cond)
        padded = [lps + [_mean(lps)] * (width - len(lps)) for lps in cond]
        alive = list(range(len(cond)))
        for j in range(width):
            best = max(padded[i][j] for i in alive)
            alive = [i for i in alive if padded[i][j] == best]
            if len(alive) == 1:
                break
        return alive[0], [_mean(lps) for lps in cond]


class UnconditionalLikelihoodNormalized(ChoicesMethod):
    name = "unconditional_likelihood_normalized"
    needs_unconditional = True

    def decide(self, cond: list[list[float]], uncond: list[list[float]] | None) -> tuple[int, list[float]]:
        assert uncond is not None
        scores = [_mean(c) - (_mean(u) if u else 0.0) for c, u in zip(cond, uncond, strict=True)]
        return _first_best(scores), scores


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()


def _unconditional_logprobs(outs: Any) -> list[list[float]]:
    """Each choice's token logprobs scored alone; the first, which has none, as 0 (SGLang's
    convention), so that a choice's conditional and unconditional lists cover the same tokens."""
    return [[0.0 if t[0] is None else t[0] for t in o["meta_info"]["input_token_logprobs"]] for o in outs]


def select_choice(
    backend: Backend, prefix: str, choices: list[str], program_id: str | None = None,
    method: ChoicesMethod = token_length_normalized,
) -> tuple[str, dict[str, Any]]:
    if backend.can_cache_prefix and prefix:
        n = backend.cache_prefix(prefix, program_id)["meta_info"]["prompt_tokens"]
    else:
        n = 0  # nothing to reuse (or no prefix at all): score from the first token
    start = max(n - _LOOKBACK, 0)
    greedy = {"max_new_tokens": 0, "temperature": 0}
    outs = backend.generate(
        [prefix + c for c in choices], greedy, return_logprob=True, logprob_start_len=start,
        return_text_in_logprobs=True, program_id=program_id,
    )
    assert isinstance(outs, list)

    @functools.cache
    def prefix_tail() -> list[int]:
        """The prefix's token ids from ``start`` (asked for only where a choice needs them)."""
        if not prefix:
            return []
        own = backend.generate(prefix, greedy, return_logprob=True, logprob_start_len=start, program_id=program_id)
        return [t[1] for t in own["meta_info"]["input_token_logprobs"]]  # type: ignore[call-overload,index]

    per_choice = [choice_token_logprobs(prefix, c, o["meta_info"]["input_token_logprobs"], prefix_tail)
                  for c, o in zip(choices, outs, strict=True)]
    unscored = next((c for c, lps in zip(choices, per_choice, strict=True) if c and not lps), None)
    if unscored is not None:  # the choice is all in the prompt's first token, which has no logprob
        where = ("with no text before it" if not prefix else
                 f"the text before it ({prefix!r}) and choice {unscored!r} are one token, the prompt's first")
        raise ValueError(f"select(): {where}, choice {unscored!r} cannot be scored (a prompt's first token has "
                         "no logprob); put more text before the select")
    uncond = None
    if method.needs_unconditional:
        alone = backend.generate(list(choices), greedy, return_logprob=True, logprob_start_len=0, program_id=program_id)
        uncond = _unconditional_logprobs(alone)
    best, scores = method.decide(per_choice, uncond)
    meta = {  # SGLang's keys (the first three), then ours
        "normalized_prompt_logprobs": [_mean(lps) for lps in per_choice],
        "input_token_logprobs": [o["meta_info"]["input_token_logprobs"] for o in outs],
        "output_token_logprobs": [o["meta_info"]["output_token_logprobs"] for o in outs],
        "scores": scores,
        "choices_method": method.name,
        "choice_token_logprobs": per_choice,
        "cached_tokens": [o["meta_info"]["cached_tokens"] for o in outs],
        "prefix_tokens": n,
    }
    if uncond is not None:
        meta["unconditional_token_logprobs"] = uncond
    return choices[best], meta
