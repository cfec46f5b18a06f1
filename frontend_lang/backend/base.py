"""The interface every DSL backend implements: SGLang's native ``/generate`` semantics.

Rules:
- ``generate`` takes one prompt (returns a dict) or a list (returns a list) and returns
  results shaped like ``/generate``'s (``text``, ``output_ids``, ``meta_info``). A list is
  sent as one batch, so the scheduler runs it together and shares its prefixes.
- ``generate_stream`` yields cumulative results of one prompt; the last one is final.
- ``program_id`` marks a request as part of a running program: the server keeps its prefix
  cached until ``end_program(program_id)``.
- ``generate_chat`` runs one assistant turn of a chat with tools (``frontend_lang/tools.py``):
  by default the backend renders the messages with ``chat_prompt`` (its server's chat
  template, tools and call grammar) and generates from that text; a chat-API backend sends
  the messages instead. ``chat_text`` is the conversation's text between turns.
- Errors raise ``BackendError`` with the server's message.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from frontend_lang.tools import RenderedChat, ToolUse, count_calls, split_calls


class BackendError(RuntimeError):
    pass


class Backend(ABC):
    # Whether prefilling a shared prefix pays off (the server reuses cached prefixes). If
    # not, fork() sends nothing ahead and select() scores each choice's whole prompt.
    can_cache_prefix = True
    # Whether the server keeps a running program's prefixes cached (``program_id``,
    # ``end_program``); a backend that finds it cannot turns this off for later programs.
    pins_programs = True

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

    def chat_prompt(self, messages: list[dict[str, Any]], tools: ToolUse | None,
                    add_generation_prompt: bool = True) -> RenderedChat:
        """``messages`` (and ``tools``) as the server's chat route would render them."""
        driver = getattr(self, "driver_name", type(self).__name__)
        raise BackendError(f"the {driver} driver cannot run gens with tools (nothing renders its chats with them)")

    def chat_text(self, messages: list[dict[str, Any]], tools: ToolUse | None) -> str:
        """The text of a conversation with tool turns, between two turns."""
        return self.chat_prompt(messages, tools, add_generation_prompt=False).text

    def generate_chat(
        self, messages: list[dict[str, Any]], sampling_params: dict[str, Any], tools: ToolUse | None, *,
        program_id: str | None = None, stream: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """One assistant turn after ``messages``. Yields cumulative results like
        ``generate_stream`` (only the last one unless ``stream``), each with ``prompt`` (the
        rendered text the answer continues, or None where the backend has none); the last
        is marked ``final`` and has ``content`` and ``tool_calls`` (``ToolCall``s)."""
        rendered = self.chat_prompt(messages, tools)
        params = dict(sampling_params)
        if rendered.sampling_params:
            clash = next((k for k in ("regex", "json_schema", "ebnf") if params.get(k)), None)
            if clash is not None:
                raise BackendError(f"a gen with tools cannot also have {clash}")
            params.update(rendered.sampling_params)
        out: dict[str, Any] = {}
        if stream:
            for out in self.generate_stream(rendered.text, params, program_id=program_id):
                yield {**out, "prompt": rendered.text}
        else:
            out = self.generate(rendered.text, params, program_id=program_id)  # type: ignore[assignment]
        content, calls = split_calls(rendered.tool_call_parser, out["text"], count_calls(messages))
        yield {**out, "prompt": rendered.text, "final": True, "content": content, "tool_calls": calls}

    def flush_cache(self) -> bool:
        """Empty the server's prefix cache; whether it did (``sgl.flush_cache()``)."""
        raise BackendError(f"{type(self).__name__} cannot flush a cache")

    def get_server_info(self) -> dict[str, Any]:
        """The server's settings and state, as ``/get_server_info`` reports them."""
        raise BackendError(f"{type(self).__name__} has no server info")

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        pass
