"""Tool calls in the DSL, as an agent makes them through the OpenAI API:

    s += sgl.assistant(sgl.gen("calls", tools=TOOLS, tool_choice="required"))
    for call in s["calls"]:                       # ToolCall: id, name, arguments (JSON text), args
        s += sgl.tool(run(call.name, call.args), call.id)

``tools`` are OpenAI's function tools; ``tool_choice`` is ``none``, ``auto``, ``required``,
``{"type": "function", "function": {"name": ...}}`` or ``allowed_tools`` (calls of some of the
tools only, all of them shown: the prompt stays the same from step to step). Such a gen takes a whole assistant turn;
its variable holds the calls (``get_meta_info(name)["content"]`` the text beside them), or
the text with ``tool_choice="none"`` (the tools shown, no call possible).

Every backend gives the same program the same behaviour:
- OpenAI chat servers (``bench_agent/drivers/openai_chat.py``): the conversation's messages,
  ``tools`` and ``tool_choice`` go to ``/v1/chat/completions``; calls come back parsed;
- forkserve's native API and the in-process engine: the conversation is rendered by the
  server's chat template with its tools exactly as the chat route renders it
  (``/v1/chat/completions/render``), the model's calls are held to the call format by the
  same grammar (``ebnf``, ``runtime/server/tools/constraint.py``) and read by the same parser.
From the first tool call on, every gen of the conversation is rendered that way, and the
state's text becomes the rendered prompt plus the answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runtime.sampling.params import InvalidField
from runtime.server.tools.choice import call_rule


@dataclass(frozen=True)
class ToolUse:
    """What a gen offers the model: its tools, the choice, whether several calls may come."""

    tools: list[dict[str, Any]]
    choice: str | dict[str, Any] | None = None
    parallel: bool | None = None

    def request_fields(self) -> dict[str, Any]:
        """The OpenAI request fields (unset ones left out)."""
        out: dict[str, Any] = {"tools": self.tools}
        if self.choice is not None:
            out["tool_choice"] = self.choice
        if self.parallel is not None:
            out["parallel_tool_calls"] = self.parallel
        return out


def tool_use(tools: Any, choice: Any, parallel: Any) -> ToolUse | None:
    """A gen's tool arguments, checked (None: a gen without tools)."""
    if tools is None:
        if choice is not None or parallel is not None:
            raise ValueError("gen(): tool_choice and parallel_tool_calls need tools")
        return None
    if not isinstance(tools, list) or not tools:
        raise ValueError("gen(): tools must be a non-empty list of OpenAI function tools")
    for t in tools:
        if not (isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
                and isinstance(t["function"].get("name"), str)):
            raise ValueError(f'gen(): each tool must be {{"type": "function", "function": {{"name": ...}}}}, got {t!r}')
    try:
        call_rule(tools, choice)
    except InvalidField as err:
        raise ValueError(f"gen(): {err}") from None
    if parallel is not None and not isinstance(parallel, bool):
        raise ValueError(f"gen(): parallel_tool_calls must be true or false, got {parallel!r}")
    return ToolUse(list(tools), choice, parallel)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object as text, as OpenAI's function.arguments
    args: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", json.loads(self.arguments))

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class RenderedChat:
    """A conversation as a native backend's chat template renders it."""

    text: str
    sampling_params: dict[str, Any]  # the output constraint the chat route adds (the call grammar as ebnf)
    tool_call_parser: str | None  # how calls are read from the answer (None: no calls expected)


def count_calls(messages: list[dict[str, Any]]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages)


def split_calls(parser_name: str | None, text: str, first: int) -> tuple[str, list[ToolCall]]:
    """(content, calls) of an answer, read with the named parser; calls get the ids
    ``call_<first>``, ``call_<first + 1>``... (unique in the conversation, and the same on
    every run, so programs stay reproducible)."""
    if parser_name is None:
        return text, []
    from runtime.server.tools.parsers import get_parser

    content, parsed = get_parser(parser_name).parse(text)
    return content, [ToolCall(f"call_{first + i}", c.name, c.arguments) for i, c in enumerate(parsed)]


def has_tool_turns(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
