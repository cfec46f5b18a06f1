"""The grammar engine the server runs: xgrammar (token-level automata, adaptive bitmask
caches), imported on first use."""

from __future__ import annotations

from typing import Any

import torch

from runtime.constrained.backend import Grammar, GrammarBackend, GrammarMatcher
from runtime.constrained.spec import GrammarSpec, engine_message


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, matcher: Any) -> None:
        self._m = matcher

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._m.is_terminated():  # xgrammar refuses to fill then; nothing may follow
            bitmask[row] = 0
        else:
            self._m.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def jump_forward_string(self) -> str:
        return self._m.find_jump_forward_string()


class XGrammar(Grammar):
    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled

    def matcher(self) -> GrammarMatcher:
        import xgrammar as xgr

        return XGrammarMatcher(xgr.GrammarMatcher(self._compiled))


class XGrammarBackend(GrammarBackend):
    """``hf_tokenizer``: the model's Hugging Face tokenizer; ``vocab_size``: the width of the
    model's logits (may exceed the tokenizer's length; the extra ids are never allowed)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...], threads: int = 1) -> None:
        import xgrammar as xgr

        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids))
        # Our own LRU (grammar_cache.py) bounds what is kept; the compiler's cache would not.
        self._compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)

    def compile(self, spec: GrammarSpec) -> Grammar:
        c = self._compiler
        try:
            if spec.kind == "regex":
                compiled = c.compile_regex(spec.text)
            elif spec.kind == "json_schema":
                # Compact JSON: free whitespace lets a small model wander into endless blank lines.
                compiled = c.compile_json_schema(spec.text, any_whitespace=False)
            else:
                compiled = c.compile_grammar(spec.text)
        except Exception as err:
            raise ValueError(f"{spec.kind} cannot be compiled: {engine_message(err)}") from err
        return XGrammar(compiled)
