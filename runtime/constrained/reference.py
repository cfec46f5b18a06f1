"""A brute-force grammar engine for tests: regular expressions only, every token of the
vocabulary tried against the text so far at every step with the ``regex`` package's partial
matching. Slow (one regex match per vocabulary entry and step) and obviously right."""

from __future__ import annotations

import regex
import torch

from runtime.constrained.backend import Grammar, GrammarBackend, GrammarMatcher
from runtime.constrained.spec import GrammarSpec


class ReferenceRegexMatcher(GrammarMatcher):
    def __init__(self, pattern: regex.Pattern[str], vocab: list[str | None], stop_ids: set[int]) -> None:
        self.pattern, self.vocab, self.stop_ids = pattern, vocab, stop_ids
        self.texts = [""]  # the text after each accepted token
        self.terminated = False

    def _allows(self, token_id: int) -> bool:
        if self.terminated:
            return False
        text = self.texts[-1]
        if token_id in self.stop_ids:
            return self.pattern.fullmatch(text) is not None
        piece = self.vocab[token_id] if token_id < len(self.vocab) else None
        if not piece:  # special tokens, byte fragments, ids past the tokenizer
            return False
        return self.pattern.fullmatch(text + piece, partial=True) is not None

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        vocab = bitmask.shape[1] * 32
        allowed = torch.tensor([self._allows(t) for t in range(min(vocab, len(self.vocab)))], dtype=torch.bool)
        bits = torch.zeros(bitmask.shape[1] * 32, dtype=torch.int64)
        bits[: allowed.numel()] = allowed.to(torch.int64)
        words = (bits.reshape(-1, 32) << torch.arange(32)).sum(-1)
        bitmask[row] = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)

    def accept_token(self, token_id: int) -> bool:
        if not self._allows(token_id):
            return False
        if token_id in self.stop_ids:
            self.terminated = True
            self.texts.append(self.texts[-1])
        else:
            self.texts.append(self.texts[-1] + self.vocab[token_id])  # type: ignore[operator]
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            del self.texts[-num_tokens:]
            self.terminated = False

    def is_terminated(self) -> bool:
        return self.terminated

    def jump_forward_string(self) -> str:
        return ""  # never jumps: compare it with jump-forward off


class ReferenceRegex(Grammar):
    def __init__(self, backend: ReferenceRegexBackend, pattern: regex.Pattern[str]) -> None:
        self.backend, self.pattern = backend, pattern

    def matcher(self) -> GrammarMatcher:
        return ReferenceRegexMatcher(self.pattern, self.backend.vocab, self.backend.stop_ids)


class ReferenceRegexBackend(GrammarBackend):
    """``vocab[t]``: the text token ``t`` adds (None for special tokens and for tokens that
    are not whole characters)."""

    def __init__(self, vocab: list[str | None], vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        self.vocab, self.vocab_size, self.stop_ids = vocab, vocab_size, set(stop_token_ids)

    @classmethod
    def from_hf(cls, hf_tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]) -> ReferenceRegexBackend:  # noqa: ANN001
        special = set(hf_tokenizer.all_special_ids)
        vocab: list[str | None] = []
        for t in range(len(hf_tokenizer)):
            piece = hf_tokenizer.decode([t]) if t not in special else None
            vocab.append(None if piece is None or "\ufffd" in piece else piece)
        return cls(vocab, vocab_size, stop_token_ids)

    def compile(self, spec: GrammarSpec) -> Grammar:
        if spec.kind != "regex":
            raise ValueError("the reference grammar engine only handles regex")
        return ReferenceRegex(self, regex.compile(spec.text))
