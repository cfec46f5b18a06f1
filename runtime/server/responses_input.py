"""What a ``/v1/responses`` request asks, as a chat completion request: ``instructions`` as the
system message, the stored conversation of ``previous_response_id`` (or the items of the
``conversation`` named) next, then each ``input``
item as a chat message (``message`` items with text parts, ``function_call`` items as the
assistant's tool calls, ``function_call_output`` items as tool messages, ``reasoning`` items as
the next assistant message's ``reasoning_content``), function tools as
chat tools, ``text.format`` as ``response_format``. Anything else is a 400 naming the item.
And a stored request's input items, as ``GET /v1/responses/{id}/input_items`` pages them
(the store itself: ``response_store.py``)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from runtime.server.context import validation_400
from runtime.server.protocol import ApiError
from runtime.server.protocol_openai import FUNCTION_NAME, ChatCompletionRequest, SharedSampling
from runtime.server.protocol_responses import ResponsesRequest

TEXT_PARTS = ("input_text", "output_text", "text")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Fields that pass to the chat request under the same name (SGLang's extras).
SAMPLING_EXTRAS = tuple(SharedSampling.model_fields)


def _text_of(content: Any, where: str) -> str:
    """A message's or a tool output's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of content parts", param=where)
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise ApiError(400, f"{where}.content[{k}]: content of type '{kind}' is not supported (text only)",
                           param=where)
    return "".join(texts)


def _field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise ApiError(400, f"{where}.{name} must be a string", param=where)
    return value


def _reasoning_text(item: dict[str, Any]) -> str:
    """The text of a reasoning item's ``reasoning_text`` parts ("" for a summary or encrypted
    content only: neither is the reasoning a template would show)."""
    parts = item.get("content")
    return "".join(p["text"] for p in parts if isinstance(p, dict) and p.get("type") == "reasoning_text"
                   and isinstance(p.get("text"), str)) if isinstance(parts, list) else ""


def input_messages(items: str | list[dict[str, Any]], field: str = "input") -> list[dict[str, Any]]:
    """The chat messages of a request's ``input`` (or of a response's ``output``: the same
    items). A ``reasoning`` item's text becomes the ``reasoning_content`` of the assistant
    message that follows it, as the chat route takes it (templates of reasoning models show
    the reasoning of the turn in progress, e.g. between tool calls)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    reasoning = ""  # of the assistant turn to come

    def assistant(message: dict[str, Any]) -> dict[str, Any]:
        nonlocal reasoning
        if reasoning:
            message["reasoning_content"] = message.get("reasoning_content", "") + reasoning
            reasoning = ""
        return message

    for i, item in enumerate(items):
        where, kind = f"{field}[{i}]", item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"{where}.role must be user, system, developer or assistant", param=where)
            message = {"role": role, "content": _text_of(item.get("content"), where)}
            if role != "assistant":
                reasoning = ""  # reasoning belongs to the assistant turn right after it
            messages.append(assistant(message) if role == "assistant" else message)
        elif kind == "function_call":
            call = {"id": _field(item, "call_id", where), "type": "function",
                    "function": {"name": _field(item, "name", where), "arguments": _field(item, "arguments", where)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the calls of one turn: one assistant message
                assistant(last).setdefault("tool_calls", []).append(call)
            else:
                messages.append(assistant({"role": "assistant", "content": "", "tool_calls": [call]}))
        elif kind == "function_call_output":
            reasoning = ""
            messages.append({"role": "tool", "tool_call_id": _field(item, "call_id", where),
                             "content": _text_of(item.get("output"), where)})
        elif kind == "reasoning":
            reasoning += _reasoning_text(item)
        else:
            raise ApiError(400, f"{where}: input items of type '{kind}' are not supported by this server "
                                "(message, function_call, function_call_output, reasoning)", param=where)
    return messages


def stored_input_items(items: str | list[dict[str, Any]], hex_id: str) -> list[dict[str, Any]]:
    """A request's ``input`` as ``GET /v1/responses/{id}/input_items`` lists it: each item
    with its type, an id (the client's, else one of ours) and text as content parts."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    out = []
    for i, item in enumerate(items):
        item = {"type": "message", **item}
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}[item["type"]]
        item.setdefault("id", f"{prefix}_{hex_id}_in{i}")
        item.setdefault("status", "completed")
        if item["type"] == "message":
            if isinstance(item.get("content"), str):
                kind = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": kind, "text": item["content"]}]
            item["content"] = [{"annotations": [], **p} if p.get("type") == "output_text" else p for p in item["content"]]
        out.append(item)
    return out


def item_list(data: list[dict[str, Any]], has_more: bool = False) -> dict[str, Any]:
    """Items in OpenAI's list shape."""
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def item_page(items: list[dict[str, Any]], limit: int, order: str, after: str | None,
              of: str = "this response's input") -> dict[str, Any]:
    """A page of stored items (``order`` desc: newest first) of ``of``."""
    if not 1 <= limit <= 100:
        raise ApiError(400, f"limit must be in [1, 100], got {limit}", param="limit")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"order must be asc or desc, got {order!r}", param="order")
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise ApiError(400, f"No item with id '{after}' in {of}", param="after")
        ordered = ordered[ids.index(after) + 1:]
    return item_list(ordered[:limit], len(ordered) > limit)


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise ApiError(400, f"tools[{i}]: tools of type '{tool.get('type')}' are not supported by this server "
                                "(function tools only)", param=f"tools[{i}]")
        name = tool.get("name")
        if not isinstance(name, str) or re.fullmatch(FUNCTION_NAME, name) is None:  # the chat route would name its own path
            raise ApiError(400, f"tools[{i}].name: a function tool needs a name of 1 to 64 letters, digits, "
                                f"'_', '.' or '-', got {name!r}", param=f"tools[{i}].name")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _chat_function(entry: Any, where: str) -> dict[str, Any]:
    """``{"type": "function", "name": N}`` as the chat API names it."""
    if isinstance(entry, dict) and entry.get("type") == "function" and isinstance(entry.get("name"), str):
        return {"type": "function", "function": {"name": entry["name"]}}
    kind = entry.get("type") if isinstance(entry, dict) else type(entry).__name__
    raise ApiError(400, f"{where} of type '{kind}' is not supported by this server "
                        "(none, auto, required, a function by name, or allowed_tools of functions)", param="tool_choice")


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """The chat API's form of a Responses ``tool_choice`` (checked against the tools there)."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "allowed_tools":
        entries = choice.get("tools")
        if not isinstance(entries, list):
            raise ApiError(400, "allowed_tools needs a 'tools' list", param="tool_choice")
        return {"type": "allowed_tools", "allowed_tools": {
            "mode": choice.get("mode"), "tools": [_chat_function(e, "allowed_tools.tools entry") for e in entries]}}
    return _chat_function(choice, "tool_choice")


def response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema = {"name": fmt.name or "output", "schema": fmt.schema_, "strict": fmt.strict, "description": fmt.description}
    return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}


def _check_call_outputs(history: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
    """Each ``function_call_output`` of the input answers a function call made before it (in
    the input, the previous response or the conversation), as OpenAI requires: a 400
    otherwise. (What the history already holds is not judged again.)"""
    calls = {call["id"] for message in history for call in message.get("tool_calls") or ()}
    for message in new:
        calls.update(call["id"] for call in message.get("tool_calls") or ())
        if message["role"] == "tool" and message["tool_call_id"] not in calls:
            raise ApiError(400, f"no function call with call_id '{message['tool_call_id']}' comes before its "
                                "function_call_output", param="input")


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
    """The chat request, and the conversation it holds without the instructions (what a later
    ``previous_response_id`` continues)."""
    new = input_messages(req.input)
    conversation = [*history, *new]
    if not conversation:
        raise ApiError(400, "input must hold at least one item (it may be left out only after "
                            "previous_response_id or a conversation with items)", param="input")
    _check_call_outputs(history, new)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation
    logprobs = LOGPROBS_INCLUDE in (req.include or []) or bool(req.top_logprobs)
    body = {
        "model": req.model, "messages": messages, "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice), "parallel_tool_calls": req.parallel_tool_calls,
        "max_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
        # a background run streams from the scheduler whatever its client asked: its output so
        # far and its events grow as it goes
        "stream": req.stream or req.background, "response_format": response_format(req), "logprobs": logprobs,
        "top_logprobs": req.top_logprobs if logprobs else None,
        "reasoning_effort": (req.reasoning or {}).get("effort"), "chat_template_kwargs": req.chat_template_kwargs,
        **{name: getattr(req, name) for name in SAMPLING_EXTRAS},
    }
    if isinstance(req.prompt_cache_options, dict) and req.prompt_cache_options.get("prewarm"):
        raise ApiError(400, "prompt_cache_options.prewarm is not supported by this server", param="prompt_cache_options")
    try:
        chat = ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as err:  # a field the chat request checks (e.g. a tool's name)
        raise _in_responses_words(validation_400(err)) from err
    return chat, conversation


def _in_responses_words(err: ApiError) -> ApiError:
    """A chat request's error about a tool, as the Responses request has it: a tool's fields
    are the tool's own here, not its ``function`` object's (``tools[0].parameters``)."""
    if err.param is not None and (flat := re.sub(r"^(tools\[\d+\])\.function\b", r"\1", err.param)) != err.param:
        err.message = err.message.replace(err.param, flat, 1)
        err.param = flat
    return err
