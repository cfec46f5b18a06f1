"""llguidance, the grammar engine for JSON schemas xgrammar would not enforce whole
(``schema_support``) and for Lark grammars (``spec.is_lark``): it keeps a ``pattern`` together with ``minLength`` / ``maxLength``,
``allOf`` of several schemas, ``multipleOf`` on numbers, ``format`` with ``pattern``, and
escapes what a pattern's matches hold; what it cannot keep it refuses by name. Imported on
first use. JSON is written as the xgrammar backend writes it: ``{"a": 1, "b": [1, 2]}``."""

from __future__ import annotations

from typing import Any

import torch

from runtime.constrained.backend import Grammar, GrammarBackend, GrammarMatcher
from runtime.constrained.llguidance_grammar import json_grammar, lark_grammar, llguidance_refusal
from runtime.constrained.spec import GrammarSpec, is_lark


class LLGuidanceMatcher(GrammarMatcher):
    """llguidance stops by itself once the grammar is complete and then allows only a stop
    token; the matcher is terminated (allowing nothing) once that token is accepted."""

    def __init__(self, matcher: Any, stop_ids: frozenset[int]) -> None:
        self._m, self._stop_ids = matcher, stop_ids
        self._ended = False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._ended:
            bitmask[row] = 0
            return
        words = bitmask[row]
        self._m.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())

    def accept_token(self, token_id: int) -> bool:
        if self._ended:
            return False
        if token_id in self._stop_ids:
            self._ended = bool(self._m.is_accepting())
            return self._ended
        # A refused token would put the matcher in its error state for good: test it first.
        if self._m.validate_tokens([token_id]) != 1:
            return False
        return bool(self._m.consume_token(token_id))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._ended:  # the stop token was the last one, and never reached llguidance
            self._ended, num_tokens = False, num_tokens - 1
        if num_tokens:
            self._m.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self._ended

    def jump_forward_string(self) -> str:
        forced = self._m.compute_ff_bytes()
        for cut in range(4):  # the bytes may end inside a character: leave that one out
            try:
                return forced[: len(forced) - cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
        return ""


class LLGuidanceGrammar(Grammar):
    def __init__(self, tokenizer: Any, grammar: str, stop_ids: frozenset[int]) -> None:
        self._tokenizer, self._grammar, self._stop_ids = tokenizer, grammar, stop_ids

    def matcher(self) -> GrammarMatcher:
        import llguidance

        return LLGuidanceMatcher(llguidance.LLMatcher(self._tokenizer, self._grammar, log_level=0), self._stop_ids)


class LLGuidanceBackend(GrammarBackend):
    """JSON schemas and Lark grammars. ``hf_tokenizer``: the model's Hugging Face (fast) tokenizer;
    ``vocab_size``: the width of the model's logits."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        import llguidance.hf

        self.vocab_size, self._stop_ids = vocab_size, frozenset(stop_token_ids)
        self._tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=list(stop_token_ids))

    def compile(self, spec: GrammarSpec) -> Grammar:
        if spec.kind == "json_schema":
            grammar = json_grammar(spec.text)
        elif is_lark(spec):
            grammar = lark_grammar(spec.text)
        else:
            raise ValueError("the llguidance backend here compiles JSON schemas and Lark grammars only")
        refusal = llguidance_refusal(grammar)
        if refusal is not None:
            raise ValueError(f"{spec.kind} cannot be compiled: {refusal}")
        return LLGuidanceGrammar(self._tokenizer, grammar, self._stop_ids)
