"""Jump-forward decoding (SGLang's "compressed FSM"): where a request's grammar allows only
one continuation (``{"name": "``, a closing brace, the rest of a keyword), append its tokens
at once instead of sampling them one step each; the next step computes them as one extend.

The forced text is tokenized together with the request's newest token, which has no KV yet,
so a merge across the boundary gives the tokens the tokenizer would give (the newest token
may be replaced). Merges reaching further back are not attempted: the text is jumped only
when decoding the new tokens after the two before them gives exactly the old text plus the
forced text.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.scheduler.req import Req

MAX_JUMP_TOKENS = 32  # a jump is one extend chunk; longer forced text jumps again next step


def is_eligible(req: Req) -> bool:
    """Requests whose per-token reports a jump would skip are never jumped: logprobs (no
    logits for forced tokens) and stop strings / regexes (checked on sampled tokens)."""
    p = req.params
    return req.grammar is not None and not req.options.return_logprob and not p.stop and not p.stop_regex


def jump_forward(req: Req, decode: Callable[[list[int]], str], encode: Callable[[str], list[int]], room: int) -> int:
    """Extend ``req.output_ids`` by the text its grammar forces after the newest token (at
    most ``room`` more tokens); returns how many tokens were added (0: no jump)."""
    matcher = req.grammar
    assert matcher is not None
    forced = matcher.jump_forward_string()
    if not forced or room <= 0:
        return 0
    newest = req.output_ids[-1]
    context = req.output_ids[-3:-1]
    before = decode([*context, newest])
    full = encode(decode([newest]) + forced)
    ids = _before_stop_token(full[: min(room + 1, MAX_JUMP_TOKENS)], newest, req.params.stop_token_ids)
    if len(ids) <= 1 or decode([*context, *full]) != before + forced:
        return 0
    matcher.rollback(1)
    for k, token in enumerate(ids):
        if not matcher.accept_token(token):  # the retokenized text strays from the grammar
            matcher.rollback(k)
            matcher.accept_token(newest)
            return 0
    req.output_ids[-1:] = ids
    req.stop_text = None  # its last token was replaced: decode the output afresh
    return len(ids) - 1


def _before_stop_token(ids: list[int], newest: int, stop_token_ids: list[int]) -> list[int]:
    """``ids`` up to a stop token among the forced ones: that one is sampled, so that the
    stop rules see it (jumped tokens are never checked); the first id replaces ``newest``,
    which was checked unless the tokenizer merged it into another token."""
    if not stop_token_ids:
        return ids
    stops = set(stop_token_ids)
    cut = next((k for k, t in enumerate(ids) if t in stops and (k > 0 or t != newest)), len(ids))
    return ids[:cut]
