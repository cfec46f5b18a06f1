"""The interface every DSL backend implements: SGLang's native ``/generate`` semantics.

Rules:
- ``generate`` takes one prompt (returns a dict) or a list (returns a list) and returns
  results shaped like ``/generate``'s (``text``, ``output_ids``, ``meta_info``). A list is
  sent as one batch, so the scheduler runs it together and shares its prefixes.
- ``generate_stream`` yields cumulative results of one prompt; the last one is final.
- ``program_id`` marks a request as part of a running program: the server keeps its prefix
  cached until ``end_program(program_id)``.
- Errors raise ``BackendError`` with the server's message.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any


class BackendError(RuntimeError):
    pass


class Backend(ABC):
    # Whether prefilling a shared prefix pays off (the server reuses cached prefixes). If
    # not, fork() sends nothing ahead and select() scores each choice's whole prompt.
    can_cache_prefix = True

    @abstractmethod
    def generate(
        self,
        prompt: str | list[str],
        sampling_params: dict[str, Any],
        *,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        return_text_in_logprobs: bool = False,
        program_id: str | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]: ...

    @abstractmethod
    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], *, program_id: str | None = None
    ) -> Iterator[dict[str, Any]]: ...

    @abstractmethod
    def role_markers(self) -> dict[str, Any]:
        """The chat template's role prefixes and suffixes (``Tokenizer.role_markers``)."""

    @abstractmethod
    def end_program(self, program_id: str) -> None: ...

    def cache_prefix(self, prompt: str, program_id: str | None = None) -> dict[str, Any]:
        """Prefill ``prompt`` once (no output) so that requests extending it reuse it."""
        return self.generate(prompt, {"max_new_tokens": 0}, program_id=program_id)  # type: ignore[return-value]

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        pass
