"""vLLM's ``prompt_logprobs`` field as vLLM answers it: per prompt token after the first, a
map from token id to logprob, rank and text, the prompt's token first, then the most likely
others at that position (``render``); the first token has none (``None``)."""

from __future__ import annotations

import functools
import os
from typing import Any

from runtime.server.scheduler_client import ReqState

# The least logprob the OpenAI routes report, as vLLM's: a token a grammar rules out has -inf,
# which JSON can only write as null, where OpenAI's schema has a number.
MIN_LOGPROB = -9999.0


def api_logprob(lp: float) -> float:
    return max(lp, MIN_LOGPROB)


class TokenTexts:
    """A token's text as vLLM's logprobs name it (``decoded_token``): the token decoded
    alone; where that ends in part of a character, what it adds to the text of the tokens
    before it (the character it completes, or "" if it does not)."""

    CONTEXT = 4  # tokens before it that may hold the rest of its character

    def __init__(self, tokenizer: Any) -> None:
        self._decode = functools.lru_cache(maxsize=4096)(lambda ids: tokenizer.decode(list(ids), False))

    def of(self, token_id: int, before: list[int]) -> str:
        alone = self._decode((token_id,))
        if not alone.endswith("\ufffd"):
            return alone
        for n in range(1, min(len(before), self.CONTEXT) + 1):
            context = before[-n:]
            whole = self._decode((*context, token_id))
            if whole.endswith("\ufffd"):
                continue
            clean = len(context)  # context tokens that were parts of this character themselves
            while clean and self._decode((context[clean - 1],)).endswith("\ufffd"):
                clean -= 1
            prefix = self._decode(tuple(context[:clean])) if clean else ""
            return whole[len(os.path.commonprefix([prefix, whole])):]
        return ""


def render(scored: ReqState, ids: list[int], top: int, tokenizer: Any) -> list[dict[str, Any] | None]:
    """The field for prompt ``ids`` from the request that scored it (``scored``: its prompt
    logprobs, top lists and ranks from the first token on), with ``top`` others per token."""
    text = TokenTexts(tokenizer)
    out: list[dict[str, Any] | None] = [None]
    for p in range(1, len(scored.input_token_logprobs)):
        lp, tid = scored.input_token_logprobs[p]
        before = ids[max(p - TokenTexts.CONTEXT, 0) : p]
        entry = {str(tid): {"logprob": api_logprob(lp), "rank": scored.input_token_ranks[p],
                            "decoded_token": text.of(tid, before)}}
        for rank, (v, t) in enumerate((scored.input_top_logprobs[p] or [])[:top], start=1):
            if t != tid:
                entry[str(t)] = {"logprob": api_logprob(v), "rank": rank, "decoded_token": text.of(t, before)}
        out.append(entry)
    return out
