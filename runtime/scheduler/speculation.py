"""Speculative decoding by prompt lookup (``--speculative-algorithm NGRAM``): which requests
guess, how long their guesses are, and what a checked guess adds to the output.

A step that decodes a request with a draft ``d1..dk`` computes its last token and the draft
as one extend (``batch.decode_batch``), with greedy picks ``g0..gk`` at those k + 1 positions
(``g0`` is the token plain decoding would give now; ``gi`` the one after ``d1..di``). While
``di == g(i-1)`` the draft agreed with the model, so the request gains ``g0..ga`` (a agreed
tokens plus the model's own next one) in one step, and the rejected tokens' KV slots are
given back. For greedy requests this is the same output as decoding one token a step.

How long a draft pays depends on the machine: where a decode step is bound by reading the
weights (bfloat16 on AMX or AVX512-BF16) extra rows cost little; where it is bound by
arithmetic (float32 on AVX2) each costs about what a request's token does. ``StepCost``
fits the decode steps' seconds to their requests and draft tokens as they run, and a
draft's j-th token is checked only where its chance of being kept (the request's
acceptance so far, or that of drafts with as long a match) to the j-th power beats what
it costs against what a token costs (``StepCost.threshold``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.config import ServerArgs
from runtime.scheduler.ngram_lookup import NgramLookup
from runtime.scheduler.req import Req

# Before the fit has steps with and without drafts: check a token kept a quarter of the time
# or more (at the prior's even odds, drafts of 2), so that there are drafts to learn from.
_PRIOR_THRESHOLD = 0.25
_MIN_STEPS_TO_FIT = 16
# Steps without drafts the fit needs (what running a step as an extend costs); while the
# window has fewer, every _PLAIN_STEP_EVERY-th step checks no drafts.
_MIN_PLAIN_STEPS, _PLAIN_STEP_EVERY = 4, 8
# The prompt tokens a request's lookup indexes (its latest): bounds the first draft's cost
# and each request's index on long prompts.
LOOKBACK_TOKENS = 4096
# A request's own acceptance counts after this many tokens' worth of evidence; until then
# the acceptance of drafts with as long a match (over all requests) stands in for it.
_PRIOR_WEIGHT = 4.0


def can_speculate(req: Req) -> bool:
    """Greedy with nothing that reads the logits' row of each token (logprobs, penalties,
    logit_bias, a grammar, tokens banned before ``min_new_tokens``)."""
    p = req.params
    return (p.is_greedy and not p.has_penalties and not req.options.return_logprob and req.grammar is None
            and req.grammar_future is None and len(req.output_ids) >= p.min_new_tokens)


@dataclass
class StepCost:
    """Seconds of the steps that only decode ~= fixed + per_request * requests + per_draft *
    draft tokens, + per_request_checking * requests in steps with drafts (they run as an
    extend, whose attention may cost a request more than a decode step's, and on CUDA without
    a captured graph); least squares over the last ``window`` such steps."""

    window: int = 128
    steps: deque[tuple[int, int, float]] = field(default_factory=deque)
    _fitted: tuple[float, float, float, float] | None = None
    _fit_is_current: bool = False

    def observe(self, requests: int, drafted: int, seconds: float) -> None:
        self.steps.append((requests, drafted, seconds))
        if len(self.steps) > self.window:
            self.steps.popleft()
        self._fit_is_current = False

    def wants_plain_steps(self) -> bool:
        """Too few steps without drafts to tell what checking drafts at all costs."""
        return sum(1 for _, drafted, _ in self.steps if drafted == 0) < _MIN_PLAIN_STEPS

    def per_token(self, requests: int) -> float | None:
        """Seconds a token of a step of ``requests`` without drafts costs; None before a fit."""
        fit = self.fit()
        return None if fit is None else (fit[0] + fit[1] * requests) / max(requests, 1)

    def threshold(self, requests: int) -> float:
        """What one more draft token in a step of ``requests`` costs, over what a token of a
        step without drafts costs: a token kept with at least this chance pays."""
        fit, per_token = self.fit(), self.per_token(requests)
        if fit is None or per_token is None:
            return _PRIOR_THRESHOLD
        return min(1.0, fit[2] / per_token)

    def drafts_pay(self, requests: int, drafted: int, expected: float) -> bool:
        """Whether ``drafted`` draft tokens in a step of ``requests``, expected to add
        ``expected`` tokens, save more than they cost, running the step as an extend
        included (True before a fit)."""
        fit, per_token = self.fit(), self.per_token(requests)
        if fit is None or per_token is None:
            return True
        return expected * per_token >= fit[2] * drafted + fit[3] * requests

    def fit(self) -> tuple[float, float, float, float] | None:
        """(fixed, per_request, per_draft, per_request_checking), or None while the steps
        seen cannot tell them apart or give a cost that makes no sense (a draft token or a
        step's token for free)."""
        if not self._fit_is_current:
            self._fitted, self._fit_is_current = self._least_squares(), True
        return self._fitted

    def _least_squares(self) -> tuple[float, float, float, float] | None:
        if len(self.steps) < _MIN_STEPS_TO_FIT or self.wants_plain_steps():
            return None
        data = np.array(self.steps, dtype=np.float64)
        requests, drafted = data[:, 0], data[:, 1]
        base = np.column_stack([np.ones(len(data)), requests])  # collinear where every step had as many requests
        full = np.column_stack([base, drafted, requests * (drafted > 0)])
        if np.linalg.matrix_rank(full) < np.linalg.matrix_rank(base) + 2:
            return None  # the drafts' share cannot be told apart from the requests' yet
        fixed, per_request, per_draft, checking = (float(c) for c in np.linalg.lstsq(full, data[:, 2], rcond=None)[0])
        if per_draft <= 0 or fixed + per_request * requests.min() <= 0:
            return None
        return fixed, per_request, per_draft, max(0.0, checking)


@dataclass
class NgramSpeculator:
    num_draft_tokens: int
    min_n: int
    max_n: int
    max_context_len: int
    fixed_threshold: float | None = None  # None: measured (StepCost); tests fix it
    cost: StepCost = field(default_factory=StepCost)
    drafted_tokens: int = 0  # guessed tokens checked so far
    accepted_tokens: int = 0  # of which the model agreed with
    checks: int = 0  # request-steps that checked a draft
    proposals: int = 0  # steps that asked for drafts
    # per match length: tokens agreed and tokens tried (as NgramLookup.agreed / tried)
    agreed_by_match: dict[int, int] = field(default_factory=dict)
    tried_by_match: dict[int, int] = field(default_factory=dict)

    def propose(self, reqs: list[Req], free_slots: int) -> None:
        """Set each request's ``draft`` for this step (empty where it does not guess), within
        ``free_slots`` for all their tokens, the one each decodes included; every few steps
        none while the cost fit lacks steps without drafts."""
        budget = free_slots - len(reqs)
        threshold = self.threshold(len(reqs))
        self.proposals += 1
        if self.proposals % _PLAIN_STEP_EVERY == 0 and self.fixed_threshold is None and self.cost.wants_plain_steps():
            budget = 0  # a step without drafts, for the fit
        expected = 0.0  # tokens the drafts are expected to add
        for req in reqs:
            req.draft = []
            if budget <= 0 or threshold >= 1.0 or not can_speculate(req):
                continue
            room = min(self.num_draft_tokens, budget,
                       req.params.max_new_tokens - len(req.output_ids) - 1,
                       self.max_context_len - len(req.input_ids) - len(req.output_ids) - 1)
            if room <= 0:
                continue
            lookup = self._lookup(req)
            draft = lookup.draft(room)
            if draft:
                acceptance = self._acceptance(lookup)
                draft = draft[: self._worth(acceptance, threshold, len(draft))]
                expected += sum(acceptance ** j for j in range(1, len(draft) + 1))
            req.draft = draft
            budget -= len(draft)
        drafted = sum(len(r.draft) for r in reqs)
        if self.fixed_threshold is None and drafted and not self.cost.drafts_pay(len(reqs), drafted, expected):
            for req in reqs:  # what the drafts would add does not pay for checking them at all
                req.draft = []

    def accepted(self, req: Req, picks: list[int]) -> list[int]:
        """The tokens a checked draft adds: the picks up to and including the first one that
        differs from the draft (all of them when none does)."""
        draft = req.draft
        agreed = 0
        while agreed < len(draft) and draft[agreed] == picks[agreed]:
            agreed += 1
        tried = agreed + (agreed < len(draft))
        self.checks += 1
        self.drafted_tokens += len(draft)
        self.accepted_tokens += agreed
        lookup = req.lookup
        if lookup is not None:
            lookup.agreed += agreed
            lookup.tried += tried
            n = lookup.match_len
            self.agreed_by_match[n] = self.agreed_by_match.get(n, 0) + agreed
            self.tried_by_match[n] = self.tried_by_match.get(n, 0) + tried
        return picks[: agreed + 1]

    def take(self, req: Req, picks: list[int], stop: Callable[[Req], dict[str, Any] | None]) -> int:
        """Append what the checked draft adds (``accepted``) to the output one token at a
        time, each through ``stop`` (the finish reason, or None), until the request finishes;
        clear the draft. Returns the tokens appended."""
        added = 0
        for token in self.accepted(req, picks):
            req.output_ids.append(token)
            added += 1
            req.finished_reason = stop(req)
            if req.is_finished:
                break
        req.draft = []
        return added

    def observe(self, requests: int, drafted: int, seconds: float) -> None:
        """A step that only decoded ``requests`` requests, ``drafted`` draft tokens with them."""
        self.cost.observe(requests, drafted, seconds)

    def threshold(self, requests: int) -> float:
        return self.fixed_threshold if self.fixed_threshold is not None else self.cost.threshold(requests)

    def _acceptance(self, lookup: NgramLookup) -> float:
        """The chance that a draft token after kept ones is kept: this request's record,
        drawn toward that of drafts with as long a match (itself toward even odds)."""
        n = lookup.match_len
        by_match = (self.agreed_by_match.get(n, 0) + 1) / (self.tried_by_match.get(n, 0) + 2)
        return (lookup.agreed + _PRIOR_WEIGHT * by_match) / (lookup.tried + _PRIOR_WEIGHT)

    @staticmethod
    def _worth(acceptance: float, threshold: float, longest: int) -> int:
        """Draft tokens to check: the j-th is kept with chance acceptance ** j, and pays
        where that beats ``threshold``."""
        if threshold <= 0 or acceptance >= 1:
            return longest
        if acceptance <= threshold:
            return 0
        return min(longest, math.floor(math.log(threshold) / math.log(acceptance)))

    def _lookup(self, req: Req) -> NgramLookup:
        lookup = req.lookup
        if lookup is None:
            lookup = req.lookup = NgramLookup(self.min_n, self.max_n)
            lookup.extend(req.input_ids[-LOOKBACK_TOKENS:])
            lookup.first_output = len(lookup.tokens)
        lookup.extend(req.output_ids[len(lookup.tokens) - lookup.first_output :])
        return lookup

    def stats(self) -> dict[str, int | float]:
        return {
            "spec_draft_tokens": self.drafted_tokens,
            "spec_accepted_tokens": self.accepted_tokens,
            # SGLang's name: tokens a request gains per step that checks a draft
            "avg_spec_accept_length": 1 + self.accepted_tokens / self.checks if self.checks else 0.0,
            # what a draft token's chance of being kept must beat in a step of 8 requests, now
            "spec_draft_threshold_8": self.threshold(8),
        }


def speculator_for(args: ServerArgs, max_context_len: int) -> NgramSpeculator | None:
    """The speculator ``--speculative-algorithm`` asks for; None without one."""
    if args.speculative_algorithm != "NGRAM":
        return None
    return NgramSpeculator(args.speculative_num_draft_tokens, args.speculative_ngram_min_match_window_size,
                           args.speculative_ngram_max_match_window_size, max_context_len)
