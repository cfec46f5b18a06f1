"""When is a request done? Checked after every new token."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from runtime.incremental_text import IncrementalText
from runtime.sampling import stop_regex
from runtime.scheduler.req import Req


def check_stop(
    req: Req, eos_token_ids: tuple[int, ...], max_context_len: int, decode: Callable[[list[int]], str]
) -> dict[str, Any] | None:
    """The finish reason in SGLang's shape, or None to keep going. Order: stop tokens, then
    length, then stop strings and stop regexes (one that completes on the last allowed token
    still counts as a stop)."""
    p = req.params
    token = req.output_ids[-1]
    num_out = len(req.output_ids)
    if num_out >= p.min_new_tokens:
        if token in p.stop_token_ids or (not p.ignore_eos and token in eos_token_ids):
            return {"type": "stop", "matched": token}
        # Where several stop strings or patterns match in the newest token, the one that
        # starts first stops it (as OpenAI cuts: the text holds none of them). Positions are
        # counted back from each tail's end, the tails being different spans of the output.
        hits: list[tuple[int, str]] = []
        if p.stop:
            # A stop string can only end in the newest token: decode just enough of the tail
            # (a character may take several byte-level tokens).
            tail_ids = req.output_ids[-stop_regex.tokens_for_chars(max(len(s) for s in p.stop)) :]
            tail, new_from = _tail_text(tail_ids, decode, p.min_new_tokens > 0)
            hits += [(len(tail) - at, s) for s in p.stop if (at := stop_regex.find_ending_after(tail, s, new_from)) >= 0]
        if p.stop_regex:
            n = stop_regex.tail_tokens(p.stop_regex)
            if n is None:  # the whole output, decoded a few tokens a step (not all of it again)
                tail, new_from = _output_text(req, decode)
                new_from = new_from if p.min_new_tokens > 0 else 0
            else:
                tail, new_from = _tail_text(req.output_ids[-n:], decode, p.min_new_tokens > 0)
            try:
                found = stop_regex.first_match(p.stop_regex, tail, ends_after=new_from)
            except TimeoutError:
                req.error = (f"stop_regex took longer than {stop_regex.MATCH_TIMEOUT_S:g} s to search the output; "
                             "use a pattern that does not backtrack so much")
                req.error_param = "stop_regex"
                return {"type": "abort", "message": req.error}
            if found:
                hits.append((len(tail) - found[1], found[0]))
        if hits:
            return {"type": "stop", "matched": max(hits, key=lambda hit: hit[0])[1]}
    if num_out >= p.max_new_tokens:
        return {"type": "length", "length": num_out}
    if len(req.input_ids) + num_out >= max_context_len:
        return {"type": "length", "length": num_out}
    return None


def _tail_text(ids: list[int], decode: Callable[[list[int]], str], only_new: bool) -> tuple[str, int]:
    """The text of ``ids`` and where a match must end after to stop the request: after the
    newest token's start with ``min_new_tokens`` (``stop_regex.new_text_start``), else 0."""
    text = decode(ids)
    return text, stop_regex.new_text_start(decode, ids, len(ids) - 1, text) if only_new else 0


def _output_text(req: Req, decode: Callable[[list[int]], str]) -> tuple[str, int]:
    """The text of the whole output and where the newest token's text starts in it (as
    ``stop_regex.new_text_start`` has it for a full decode); ``req.stop_text`` keeps the
    decoded text from step to step, so each step decodes only the newest few tokens."""
    state = req.stop_text
    if state is None:  # first check (``min_new_tokens`` reached), or the output was rewritten
        state = req.stop_text = IncrementalText()
        state.feed(decode, req.output_ids[:-1])
    kept, old_pending = len(state.text), state.pending  # the text only grows past ``kept``
    state.feed(decode, req.output_ids[len(state.ids) :])
    text = state.text + state.pending
    return text, kept + len(os.path.commonprefix([old_pending, text[kept:]]))


def grammar_stop(req: Req, token: int) -> dict[str, Any] | None:
    """Advance a constrained request's matcher by its new token (the bitmask allowed it);
    it is done when the grammar is complete (its stop token was accepted)."""
    assert req.grammar is not None
    if not req.grammar.accept_token(token):
        req.error = f"token {token} broke the request's grammar; this is a bug"
        return {"type": "abort", "message": req.error}
    if req.grammar.is_terminated():
        return {"type": "stop", "matched": token}
    return None
