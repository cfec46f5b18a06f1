"""Draft tokens for speculative decoding by prompt lookup: where the request's last few
tokens occurred before in its own prompt or output, guess that what followed them then
follows now. Agent programs quote and repeat their context (tool arguments, code being
edited, a draft being revised), so the guess is often right; the model checks every guess
in one forward (``Scheduler._next_tokens``, ``Scheduler._take_checked_draft``), and a greedy
request's output is what it would have been without them.

``NgramLookup`` keeps, for each n-gram of ``min_n..max_n`` tokens, where it last ended with
a token after it, and takes each new token in O(max_n): no step rescans the context. The
reference is ``draft_by_scan`` (the same answer from the whole token list)."""

from __future__ import annotations


class NgramLookup:
    """The lookup over one request's tokens (its prompt, then its output as it grows)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_n}..{max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        # n-gram -> the end (exclusive) of its latest occurrence that has a token after it
        self._ends: dict[tuple[int, ...], int] = {}
        self.match_len = 0  # tokens the last ``draft`` matched (0: none)
        self.first_output = 0  # where the request's output starts in ``tokens`` (speculation.py)
        # this request's checked drafts: tokens the model agreed with, and tokens checked up to
        # and including the first disagreement (speculation.py estimates its acceptance from them)
        self.agreed = self.tried = 0

    def extend(self, tokens: list[int]) -> None:
        """Append ``tokens`` to the indexed sequence."""
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1  # the n-grams ending here now have a token after them
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._ends[tuple(self.tokens[end - n : end])] = end

    def draft(self, k: int) -> list[int]:
        """At most ``k`` tokens that followed the latest earlier occurrence of the longest
        suffix (``max_n`` down to ``min_n`` tokens) seen before; [] when none was."""
        self.match_len = 0
        if k <= 0:
            return []
        size = len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            end = self._ends.get(tuple(self.tokens[size - n :]))
            if end is not None:
                self.match_len = n
                return self.tokens[end : end + k]
        return []


def draft_by_scan(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """``NgramLookup.draft`` from scratch: scan back for the latest earlier occurrence."""
    if k <= 0:
        return []
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        suffix = tokens[len(tokens) - n :]
        for end in range(len(tokens) - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                return tokens[end : end + k]
    return []
