"""OpenAI's deprecated function calling (chat completions before ``tools``): ``functions``,
``function_call``, assistant turns with ``function_call`` and ``function`` messages. The
request becomes its ``tools`` form (at most one call, as that API made one), and the answer
goes back in the old shape: ``message.function_call`` and ``finish_reason:
"function_call"`` (``"stop"`` for a function named by ``function_call``, as OpenAI answers a
forced one); a stream's deltas carry ``function_call`` fragments."""

from __future__ import annotations

from typing import Any

from runtime.server.protocol import ApiError
from runtime.server.protocol_openai import (
    ChatCompletionRequest,
    ChatMessage,
    Tool,
    ToolCall,
)


def as_tools(req: ChatCompletionRequest) -> ChatCompletionRequest:
    """``req`` with its deprecated function-calling fields in their ``tools`` form; ``req``
    itself where it has none."""
    legacy_turns = any(m.function_call is not None or m.role == "function" for m in req.messages)
    if req.functions is None and req.function_call is None and not legacy_turns:
        return req
    update: dict[str, Any] = {"messages": _messages(req.messages)} if legacy_turns else {}
    if req.function_call is not None and req.functions is None:
        raise ApiError(400, "'function_call' needs 'functions' (or use 'tools' and 'tool_choice')",
                       param="function_call")
    if req.functions is not None:
        if req.tools is not None:
            raise ApiError(400, "give 'tools' or the deprecated 'functions', not both", param="functions")
        if req.tool_choice is not None:
            raise ApiError(400, "'tool_choice' goes with 'tools'; with 'functions' it is 'function_call'",
                           param="tool_choice")
        choice = _tool_choice(req.function_call)
        names = [f.name for f in req.functions]
        if isinstance(choice, dict) and choice["function"]["name"] not in names:
            raise ApiError(400, f"'function_call' names {choice['function']['name']!r}, which is not among "
                                f"'functions' ({', '.join(names) or 'none'})", param="function_call")
        update.update(tools=[Tool(type="function", function=f) for f in req.functions] or None,
                      tool_choice=choice, parallel_tool_calls=False)
    return req.model_copy(update=update)


def _tool_choice(function_call: Any) -> Any:
    if function_call is None or function_call in ("none", "auto"):
        return function_call
    name = function_call.get("name") if isinstance(function_call, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, "'function_call' is 'none', 'auto' or {\"name\": ...}, got " + repr(function_call)[:200],
                       param="function_call")
    return {"type": "function", "function": {"name": name}}


def _messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Each assistant ``function_call`` as a tool call with an id of its own (9 letters and
    digits: Mistral's templates refuse any other), and each ``function`` message as the
    ``tool`` message answering the latest call of its name (in either form)."""
    out, latest = [], {}
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.function_call is not None:
            call = ToolCall(id=f"call{i:05d}", type="function", function=m.function_call)
            m = m.model_copy(update={"function_call": None, "tool_calls": [*(m.tool_calls or []), call]})
        if m.role == "assistant":
            latest.update((c.function.name, c.id) for c in m.tool_calls or ())
        elif m.role == "function":
            if m.name is None or m.name not in latest:
                raise ApiError(400, f"messages[{i}]: a 'function' message answers an assistant 'function_call' "
                                    f"before it of the function it names, got name {m.name!r}",
                               param=f"messages[{i}]")
            m = m.model_copy(update={"role": "tool", "tool_call_id": latest[m.name]})
        out.append(m)
    return out


def answer_message(message: dict[str, Any], finish: str | None) -> tuple[dict[str, Any], str | None]:
    """A chat answer's message and finish reason in the deprecated shape."""
    calls = message.pop("tool_calls", None)
    if calls:
        message["function_call"] = calls[0]["function"]
        finish = "function_call" if finish == "tool_calls" else finish
    return message, finish


def answer_delta(delta: dict[str, Any], finish: str | None) -> tuple[dict[str, Any], str | None]:
    """A streamed delta and finish reason in the deprecated shape: the first call's fragments
    as one ``function_call`` fragment (its name with the first)."""
    calls = delta.pop("tool_calls", None)
    if calls:
        fragment: dict[str, Any] = {}
        for d in calls:
            if d["index"] != 0:
                continue
            function = d.get("function") or {}
            if "name" in function:
                fragment["name"] = function["name"]
            fragment["arguments"] = fragment.get("arguments", "") + (function.get("arguments") or "")
        if fragment:
            delta["function_call"] = fragment
    return delta, "function_call" if finish == "tool_calls" else finish
