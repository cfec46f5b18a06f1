"""The grammar engines the server runs, chosen per constraint (vLLM's ``auto``): xgrammar for
every regex, EBNF and JSON schema it enforces whole; llguidance for a JSON schema with a
part xgrammar would accept without enforcing (``schema_support``) and for a grammar in
llguidance's Lark dialect (``spec.is_lark``: a client's, or the tool-call grammar of such
schemas). Both fill the same int32 bitmask, so a batch may mix them."""

from __future__ import annotations

import json
from typing import Any

from runtime.constrained.backend import Grammar, GrammarBackend
from runtime.constrained.schema_support import unhonoured_feature
from runtime.constrained.spec import GrammarSpec, is_lark
from runtime.constrained.xgrammar_backend import XGrammarBackend


def needs_llguidance(spec: GrammarSpec) -> bool:
    if spec.kind == "json_schema":
        return unhonoured_feature(json.loads(spec.text)) is not None
    return is_lark(spec)


class AutoGrammarBackend(GrammarBackend):
    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        self.vocab_size = vocab_size
        self._args = (hf_tokenizer, vocab_size, stop_token_ids)
        self._xgrammar = XGrammarBackend(*self._args)
        self._llguidance: GrammarBackend | None = None  # built on first use (~1 s)

    def compile(self, spec: GrammarSpec) -> Grammar:
        if not needs_llguidance(spec):
            return self._xgrammar.compile(spec)
        if self._llguidance is None:
            from runtime.constrained.llguidance_backend import LLGuidanceBackend

            self._llguidance = LLGuidanceBackend(*self._args)
        return self._llguidance.compile(spec)
