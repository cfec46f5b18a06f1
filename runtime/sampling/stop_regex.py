"""``stop_regex``: a regular expression whose match in the output stops the request, like a
stop string. The same three rules as for stop strings, in one place: when to stop (the
scheduler), where to cut the finished text (``Tokenizer.output_text``) and how much of a
streamed tail to hold back because it may still become a match (the detokenizer).

Patterns use the ``regex`` package (a superset of Python's ``re`` syntax) because it can
tell a *partial* match at the end of the text, which streaming needs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache

import regex

# A search that takes longer raises TimeoutError: the request stops with an error instead of
# stalling every request's step (a pattern such as ``(.*){1,32000}x`` backtracks for ever).
MATCH_TIMEOUT_S = 0.1

# A bounded pattern of width w chars is found in the last 4*w + 2 tokens: a character can
# take up to 4 byte-level tokens, and the extra tokens cover a merge at the window's edge.
_TOKENS_PER_CHAR = 4


@lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """The compiled pattern; ``regex.error`` for a bad one."""
    return regex.compile(pattern)


@lru_cache(maxsize=256)
def max_width(pattern: str) -> int | None:
    """Longest text the pattern can match, or None when the whole output must be searched:
    unbounded (``\\d+``, ``.*``), not computable, or looking left of its match (``^``,
    ``\\b``, a lookbehind), which the start of a tail window would fool."""
    try:
        import re._parser as sre_parse  # Python >= 3.11

        parsed = sre_parse.parse(pattern)
        width = parsed.getwidth()[1]
    except Exception:  # syntax only ``regex`` knows, or another Python's parser
        return None
    if width >= sre_parse.MAXREPEAT or _looks_left(parsed):
        return None
    return int(width)


def _looks_left(parsed: object) -> bool:
    """Whether a parsed pattern has an assertion about text before a position: any anchor
    but the end ones, or any lookaround (a lookahead is harmless, but rare enough to treat
    alike)."""
    import re._constants as c  # Python >= 3.11

    ends = {c.AT_END, c.AT_END_LINE, c.AT_END_STRING}
    for op, av in parsed:  # type: ignore[attr-defined]
        if op is c.AT and av not in ends or op in (c.ASSERT, c.ASSERT_NOT):
            return True
        children = av if isinstance(av, (list, tuple)) else (av,)
        for child in children:
            if hasattr(child, "getwidth") and _looks_left(child):
                return True
            if isinstance(child, list) and any(_looks_left(b) for b in child if hasattr(b, "getwidth")):
                return True
    return False


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a stop regex, or None when it can."""
    try:
        compiled = compile_pattern(pattern)
    except regex.error as err:
        return f"is not a valid regular expression ({err})"
    if compiled.fullmatch("") is not None:
        return "matches the empty string, so it would stop every request at once"
    return None


def tail_tokens(patterns: list[str]) -> int | None:
    """How many of the newest output tokens a new match can lie in (None: all of them)."""
    widths = [max_width(p) for p in patterns]
    if any(w is None for w in widths):
        return None
    return tokens_for_chars(max(widths))  # type: ignore[type-var, arg-type]


def tokens_for_chars(width: int) -> int:
    """How many of the newest output tokens a new ``width``-character match (a stop string's
    or a bounded pattern's) can lie in."""
    return _TOKENS_PER_CHAR * width + 2


def new_text_start(decode: Callable[[list[int]], str], ids: list[int], k: int, text: str) -> int:
    """Where the text of ``ids[k:]`` begins in ``text``, the text of ``ids``: what the text
    of ``ids[:k]`` shares with it (a character split at ``k`` counts as new). With
    ``min_new_tokens``, a match must end after it to be new: older ones did not stop the
    request then and do not now (as vLLM checks only new text)."""
    return len(os.path.commonprefix([decode(ids[:k]), text])) if k > 0 else 0


def find_ending_after(text: str, stop: str, ends_after: int) -> int:
    """Where the first ``stop`` in ``text`` that ends after ``ends_after`` starts, or -1."""
    return text.find(stop, max(ends_after - len(stop) + 1, 0))


def first_match(patterns: list[str] | tuple[str, ...], text: str, ends_after: int = 0) -> tuple[str, int] | None:
    """The pattern whose match starts first in ``text`` and where it starts, or None; only
    matches that end after ``ends_after`` count (every match does at 0: none is empty)."""
    best: tuple[str, int] | None = None
    for p in patterns:
        if ends_after <= 0:
            m = compile_pattern(p).search(text, timeout=MATCH_TIMEOUT_S)
        else:
            matches = compile_pattern(p).finditer(text, overlapped=True, timeout=MATCH_TIMEOUT_S)
            m = next((m for m in matches if m.end() > ends_after), None)
        if m is not None and (best is None or m.start() < best[1]):
            best = (p, m.start())
    return best


def first_new_match(pattern: str, text: str, before: str) -> tuple[int, int] | None:
    """Where the first match of ``pattern`` in ``text`` that ``before`` (the text one token
    earlier) did not have starts and ends, or None: the match that stopped the request. (A
    match with a lookahead can end before the newest token; an older one did not stop it.)"""
    compiled = compile_pattern(pattern)
    old = {m.span() for m in compiled.finditer(before, overlapped=True, timeout=MATCH_TIMEOUT_S)}
    return next((m.span() for m in compiled.finditer(text, overlapped=True, timeout=MATCH_TIMEOUT_S)
                 if m.span() not in old), None)


def held_from(patterns: tuple[str, ...], text: str) -> int:
    """Where streamed text must stop for now: the start of the earliest full or partial
    match (a tail that more output could turn into a match), else ``len(text)``."""
    cut = len(text)
    for p in patterns:
        try:
            m = compile_pattern(p).search(text, partial=True, timeout=MATCH_TIMEOUT_S)
        except TimeoutError:  # the scheduler ends such a request (``check_stop``)
            continue
        if m is not None:
            cut = min(cut, m.start())
    return cut
