"""Speculative decoding by prompt lookup (``--speculative-algorithm NGRAM``): which requests
guess, how long their guesses may be, and what a checked guess adds to the output.

A step that decodes a request with a draft ``d1..dk`` computes its last token and the draft
as one extend (``batch.decode_batch``), with greedy picks ``g0..gk`` at those k + 1 positions
(``g0`` is the token plain decoding would give now; ``gi`` the one after ``d1..di``). While
``di == g(i-1)`` the draft agreed with the model, so the request gains ``g0..ga`` (a agreed
tokens plus the model's own next one) in one step, and the rejected tokens' KV slots are
given back. For greedy requests this is the same output as decoding one token a step.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.scheduler.ngram_lookup import NgramLookup
from runtime.scheduler.req import Req


def can_speculate(req: Req) -> bool:
    """Greedy with nothing that reads the logits' row of each token (logprobs, penalties,
    logit_bias, a grammar, tokens banned before ``min_new_tokens``)."""
    p = req.params
    return (p.is_greedy and not p.has_penalties and not req.options.return_logprob and req.grammar is None
            and req.grammar_future is None and len(req.output_ids) >= p.min_new_tokens)


@dataclass
class NgramSpeculator:
    num_draft_tokens: int
    min_n: int
    max_n: int
    max_context_len: int
    drafted_tokens: int = 0  # guessed tokens checked so far
    accepted_tokens: int = 0  # of which the model agreed with
    checks: int = 0  # request-steps that checked a draft

    def propose(self, reqs: list[Req], free_slots: int) -> None:
        """Set each request's ``draft`` for this step (empty where it does not guess), within
        ``free_slots`` for all their tokens, the one each decodes included."""
        budget = free_slots - len(reqs)
        for req in reqs:
            req.draft = []
            if budget <= 0 or not can_speculate(req):
                continue
            room = min(self.num_draft_tokens, budget,
                       req.params.max_new_tokens - len(req.output_ids) - 1,
                       self.max_context_len - len(req.input_ids) - len(req.output_ids) - 1)
            if room <= 0:
                continue
            req.draft = self._lookup(req).draft(room)
            budget -= len(req.draft)

    def accepted(self, req: Req, picks: list[int]) -> list[int]:
        """The tokens a checked draft adds: the picks up to and including the first one that
        differs from the draft (all of them when none does)."""
        draft = req.draft
        agreed = 0
        while agreed < len(draft) and draft[agreed] == picks[agreed]:
            agreed += 1
        self.checks += 1
        self.drafted_tokens += len(draft)
        self.accepted_tokens += agreed
        return picks[: agreed + 1]

    def _lookup(self, req: Req) -> NgramLookup:
        lookup = req.lookup
        if lookup is None:
            lookup = req.lookup = NgramLookup(self.min_n, self.max_n)
            lookup.extend(req.input_ids)
        seen = len(lookup.tokens) - len(req.input_ids)
        lookup.extend(req.output_ids[seen:])
        return lookup

    def stats(self) -> dict[str, int | float]:
        return {
            "spec_draft_tokens": self.drafted_tokens,
            "spec_accepted_tokens": self.accepted_tokens,
            # SGLang's name: tokens a request gains per step that checks a draft
            "avg_spec_accept_length": 1 + self.accepted_tokens / self.checks if self.checks else 0.0,
        }
