"""Decoding a growing list of token ids a few tokens at a time (the prefix/read offset
scheme): the detokenizer streams with it, the DSL's in-process backend too, and the
scheduler matches unbounded stop regexes against it without re-decoding the whole output
each step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# Tokens re-decoded before the newest ones, so merges across the boundary come out right.
_INITIAL_OFFSET = 5
# A UTF-8 character has at most 4 bytes, so its first bytes at a prompt's end are in at most
# its last 3 tokens (one more for merges across them).
_CONTEXT_TOKENS = 4


def partial_char_context(prompt_ids: list[int], ends_inside_character: Callable[[list[int]], bool]) -> tuple[int, ...]:
    """The prompt's last tokens when its bytes end inside a character (a prompt of token ids
    cut inside one), else ``()``: the output's first bytes may complete it (``decode_after``).
    ``ends_inside_character``: ``TokenBytes.ends_inside_character``."""
    tail = prompt_ids[-_CONTEXT_TOKENS:]
    return tuple(tail) if tail and ends_inside_character(tail) else ()


def decode_after(decode: Callable[[list[int]], str], context: tuple[int, ...], ids: list[int]) -> str:
    """The text of output ``ids`` after prompt tokens ``context``: a character whose first
    bytes end the prompt and whose last bytes start the output is the output's (so the
    prompt's text without its partial character, plus this, is the text of both)."""
    if not context:
        return decode(ids)
    head = decode(list(context))
    full = decode([*context, *ids])
    if full.startswith(head):  # nothing completed the prompt's partial character (yet)
        return full[len(head):]
    return full[len(head) - 1:]  # head's last character is the partial one's U+FFFD


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
    context: tuple[int, ...] = ()  # the prompt's tokens that end in a partial character (``partial_char_context``)

    def feed(self, decode: Callable[[list[int]], str], new_ids: list[int]) -> None:
        if not self.ids:
            self.prefix_offset = self.read_offset = 0
        self.ids.extend(new_ids)
        if self.prefix_offset == 0 and self.context:
            before = decode_after(decode, self.context, self.ids[: self.read_offset])
            after = decode_after(decode, self.context, self.ids)
        else:
            before = decode(self.ids[self.prefix_offset : self.read_offset])
            after = decode(self.ids[self.prefix_offset :])
        self.pending = after[len(before) :]
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += self.pending
            self.pending = ""
            self.prefix_offset = max(self.read_offset, len(self.ids) - _INITIAL_OFFSET)
            self.read_offset = len(self.ids)
