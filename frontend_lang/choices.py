"""``select``: score each choice by its mean token logprob after the prefix, in one batch.

1. The prefix is prefilled once (a ``max_new_tokens: 0`` request), which also tells its
   token count ``n``.
2. One batched request scores ``prefix + choice`` for every choice, with prompt logprobs
   from position ``n - 2`` (the choice's first token may merge with the prefix's last) and
   the tokens' text. The choice's tokens are those whose text reaches past the prefix;
   the score is the mean of their logprobs (token-length normalised), the decision its
   argmax (the first on ties).
"""

from __future__ import annotations

from typing import Any

from frontend_lang.backend.base import Backend

_LOOKBACK = 2


def choice_token_logprobs(prefix: str, choice: str, triples: list[list[Any]], start: int, prefix_tokens: int) -> list[float]:
    """Logprobs of the tokens of ``prefix + choice`` that cover part of ``choice``."""
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
    if not picked:  # token texts did not line up (partial UTF-8): positions past the prefix
        picked = [t[0] for t in triples[max(prefix_tokens - start, 0) :] if t[0] is not None]
    return picked


def select_choice(
    backend: Backend, prefix: str, choices: list[str], program_id: str | None = None
) -> tuple[str, dict[str, Any]]:
    if backend.can_cache_prefix:
        n = backend.cache_prefix(prefix, program_id)["meta_info"]["prompt_tokens"]
    else:
        n = 0  # nothing to reuse: score from the first token
    start = max(n - _LOOKBACK, 0)
    outs = backend.generate(
        [prefix + c for c in choices],
        {"max_new_tokens": 0, "temperature": 0},
        return_logprob=True,
        logprob_start_len=start,
        return_text_in_logprobs=True,
        program_id=program_id,
    )
    assert isinstance(outs, list)
    per_choice = [
        choice_token_logprobs(prefix, c, o["meta_info"]["input_token_logprobs"], start, n)
        for c, o in zip(choices, outs, strict=True)
    ]
    scores = [sum(lps) / len(lps) if lps else float("-inf") for lps in per_choice]
    best = max(range(len(choices)), key=lambda i: scores[i])
    meta = {
        "normalized_prompt_logprobs": scores,
        "choice_token_logprobs": per_choice,
        "cached_tokens": [o["meta_info"]["cached_tokens"] for o in outs],
        "prefix_tokens": n,
    }
    return choices[best], meta
