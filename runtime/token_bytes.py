"""A token's own bytes, as OpenAI's logprobs report them.

A token may hold part of a UTF-8 character (an emoji is three or four byte-level tokens),
and decoding it alone gives U+FFFD. OpenAI reports such a token's real ``bytes`` (clients
join them to rebuild the characters) and names it ``bytes:\\xNN...``, which also keeps the
tokens of one top-logprobs list apart.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Collection, Sequence
from functools import cache
from typing import Any

MAX_CHAR_BYTES = 4  # a UTF-8 character's longest encoding
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


@cache
def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE's alphabet inverted: each byte is written as one printable character,
    itself where it is printable Latin-1, else a character from 256 upward, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class TokenBytes:
    """``of(token_id)``: the token's bytes; ``name(token_id)``: its text, or ``bytes:\\xNN...``
    where those bytes are not whole UTF-8."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf = hf_tokenizer
        self.special = set(hf_tokenizer.all_special_ids)
        backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        decoder = backend.decoder if backend is not None else None
        self.byte_level = decoder is not None and "ByteLevel" in json.dumps(json.loads(decoder.__getstate__()))
        self._cache: dict[int, bytes] = {}

    def of(self, token_id: int) -> bytes:
        out = self._cache.get(token_id)
        if out is None:
            out = self._cache[token_id] = self._bytes(token_id)
        return out

    def ends_inside_character(self, ids: Sequence[int]) -> bool:
        """Whether the bytes of ``ids`` end with the first bytes of a character (token ids
        cut inside one)."""
        if not ids or self.of(ids[-1])[-1:] < b"\x80":  # ends in an ASCII byte (most prompts): no
            return False
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        decoder.decode(b"".join(self.of(t) for t in ids[-MAX_CHAR_BYTES:]))
        return bool(decoder.getstate()[0])

    def _bytes(self, token_id: int) -> bytes:
        text = self.hf.decode([token_id], skip_special_tokens=False)
        if token_id in self.special:
            return text.encode()
        token = self.hf.convert_ids_to_tokens(token_id)
        if not isinstance(token, str):
            return text.encode()
        table = _byte_of_char()
        if self.byte_level and all(c in table for c in token):
            return bytes(table[c] for c in token)
        if m := _BYTE_TOKEN.fullmatch(token):
            return bytes([int(m.group(1), 16)])
        if "▁" in token:  # SentencePiece writes a space as "▁"; decoding the piece alone may drop it
            return token.replace("▁", " ").encode()
        return text.encode()

    def name(self, token_id: int) -> str:
        text = self.hf.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text:
            return text
        try:
            return self.of(token_id).decode()
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in self.of(token_id))

    def char_offsets(self, ids: Sequence[int], before: Sequence[int] = (), base: int = 0,
                     unseen: Collection[int] = ()) -> list[int]:
        """Where the text of each of ``ids`` begins, in characters, when the text before them
        (of tokens ending in ``before``; only the last ``MAX_CHAR_BYTES`` count) has ``base``
        whole characters. A token that
        continues a character (byte-level tokens split them) begins where that one does;
        tokens in ``unseen`` (special tokens the text skips) take no room."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for tid in before[-MAX_CHAR_BYTES:]:  # what is left of a split character is in these
            if tid not in unseen:
                decoder.decode(self.of(tid))
        offsets, chars = [], base
        for tid in ids:
            offsets.append(chars)
            if tid not in unseen:
                chars += len(decoder.decode(self.of(tid)))
        return offsets
