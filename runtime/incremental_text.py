"""Decoding a growing list of token ids a few tokens at a time (the prefix/read offset
scheme): the detokenizer streams with it, the DSL's in-process backend too, and the
scheduler matches unbounded stop regexes against it without re-decoding the whole output
each step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# Tokens re-decoded before the newest ones, so merges across the boundary come out right.
_INITIAL_OFFSET = 5


@dataclass
class IncrementalText:
    """The text of ``ids`` so far, without a trailing partial character (held until the
    token that completes it arrives); ``text`` only ever grows. ``text + pending`` is the
    text of all of ``ids``, the partial character decoded as U+FFFD as a full decode has it."""

    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    text: str = ""
    pending: str = ""

    def feed(self, decode: Callable[[list[int]], str], new_ids: list[int]) -> None:
        if not self.ids:
            self.prefix_offset = self.read_offset = 0
        self.ids.extend(new_ids)
        before = decode(self.ids[self.prefix_offset : self.read_offset])
        after = decode(self.ids[self.prefix_offset :])
        self.pending = after[len(before) :]
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += self.pending
            self.pending = ""
            self.prefix_offset = max(self.read_offset, len(self.ids) - _INITIAL_OFFSET)
            self.read_offset = len(self.ids)
