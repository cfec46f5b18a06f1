"""The interface of a grammar engine. Two implementations: ``XGrammarBackend`` (fast, what
the server runs) and ``ReferenceRegexBackend`` (brute force over the vocabulary, regex only,
for tests).

Rules every implementation keeps:
- ``compile(spec)`` is pure and thread-safe (the cache runs it on a worker thread); a spec
  that cannot be compiled raises ``ValueError``.
- A matcher starts at the beginning of the output. ``fill_bitmask`` sets bit ``t`` of word
  ``t // 32`` of ``bitmask[row]`` (int32) for every token ``t`` that may come next, and
  clears the others; a stop token (EOS) is allowed exactly where the constrained text may
  end. ``accept_token`` advances and returns False (changing nothing) for a token the
  grammar does not allow; after a stop token the matcher is terminated and allows nothing.
- ``rollback(n)`` undoes the last ``n`` accepted tokens.
- ``jump_forward_string()`` is text that every valid continuation starts with ("" if none).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from runtime.constrained.spec import GrammarSpec


class GrammarMatcher(ABC):
    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None: ...

    @abstractmethod
    def accept_token(self, token_id: int) -> bool: ...

    @abstractmethod
    def rollback(self, num_tokens: int) -> None: ...

    @abstractmethod
    def is_terminated(self) -> bool: ...

    @abstractmethod
    def jump_forward_string(self) -> str: ...


class Grammar(ABC):
    """A compiled constraint; cheap to start matchers from, shared between requests."""

    @abstractmethod
    def matcher(self) -> GrammarMatcher: ...


class GrammarBackend(ABC):
    vocab_size: int  # width of the logits the bitmask covers

    @abstractmethod
    def compile(self, spec: GrammarSpec) -> Grammar: ...
