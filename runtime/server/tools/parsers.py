"""Tool-call parsers: the model writes its calls as marked-up JSON in its output; a parser
splits the text into the content the user sees and the calls, whole (``parse``) or as
OpenAI's streaming deltas (``StreamingToolParser``), never letting call markup leak into
content.

Formats (``--tool-call-parser``):
- ``hermes`` / ``qwen25``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one
  block per call (Hermes, Qwen 2.5, and the template shipped for models without one);
- ``llama3_json``: an optional ``<|python_tag|>`` then ``{"name": ..., "parameters": {...}}``
  objects separated by ``;``, the whole output being calls;
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` objects.

A call's ``arguments`` is the JSON object as the model wrote it (whitespace included), so the
fragments a stream sends add up to the same string as the whole answer's.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass
class ParsedCall:
    name: str
    arguments: str  # a JSON object as text, as OpenAI's function.arguments
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


# A call object's start up to its arguments: {"name": "...", "arguments": (or "parameters")
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def _call_from(obj: object, args_key: str, text: str | None = None) -> ParsedCall | None:
    """The call in ``obj``, a decoded call object whose JSON was ``text`` (if known)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments already as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    raw = _raw_arguments(text) if text is not None else None
    return ParsedCall(obj["name"], raw if raw is not None else json.dumps(args, ensure_ascii=False))


def call_cut_after_arguments(text: str, end_marker: str = "") -> ParsedCall | None:
    """A call object that ``max_tokens`` cut off after its arguments object was whole (only
    its closing brace and the first characters of ``end_marker`` follow): the call, as a
    stream has sent it."""
    body = text.lstrip()
    head = _HEAD.match(body)
    if head is None or not body.startswith("{", head.end()):
        return None
    end = json_value_end(body, head.end())
    if end is None:
        return None
    tail = body[end:].strip()
    tail = tail[1:].lstrip() if tail.startswith("}") else tail
    if tail and not end_marker.startswith(tail):
        return None
    try:
        name, args = json.loads(f'"{head.group(1)}"'), json.loads(body[head.end():end])
    except json.JSONDecodeError:
        return None
    return ParsedCall(name, body[head.end():end]) if isinstance(args, dict) else None


def _raw_arguments(text: str) -> str | None:
    """The arguments object of a call object's JSON ``text`` as written, if it is an object
    after the name (the order the grammars write)."""
    head = _HEAD.match(text.lstrip())
    if head is None:
        return None
    body = text.lstrip()
    end = json_value_end(body, head.end())
    return body[head.end():end] if end is not None and body[head.end()] == "{" else None


def json_value_end(text: str, pos: int) -> int | None:
    """Where the JSON object, array or string starting at ``text[pos]`` ends (exclusive),
    or None while it is still open."""
    depth, in_string, escaped = 0, False, False
    for i in range(pos, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


class ToolCallParser(ABC):
    name = ""
    # text that opens the call markup; content before it is the message's text
    start: str = ""

    @abstractmethod
    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        """(content, calls). Markup that does not parse stays in the content."""

    def markup_start(self, text: str) -> int:
        """Where call markup begins in ``text``, or -1: what an answer cut off by
        ``max_tokens`` inside its first call drops (the grammar let nothing else follow it);
        also where such an answer ends in the start marker's first characters only."""
        if not self.start:
            return -1
        found = text.find(self.start)
        return found if found >= 0 else partial_marker_at(text, self.start)


def partial_marker_at(text: str, marker: str) -> int:
    """Where ``text`` ends in the first characters of ``marker`` (not all of it), or -1."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return -1


class HermesParser(ToolCallParser):
    name = "hermes"
    start = "<tool_call>"
    end = "</tool_call>"
    _block = re.compile(r"<tool_call>\s*(.*?)\s*(</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        cut = text.find(self.start)
        if cut < 0:
            return text, []
        calls = []
        for m in self._block.finditer(text, cut):
            try:
                call = _call_from(json.loads(m.group(1)), "arguments", m.group(1))
            except json.JSONDecodeError:
                call = None
            if call is None and not m.group(2):  # the last call, cut off (max_tokens)
                call = call_cut_after_arguments(m.group(1), self.end)
                if call is None and calls:  # cut inside its arguments: the others stand
                    break
            if call is None:
                return text, []
            calls.append(call)
        return text[:cut].rstrip(), calls


class Qwen25Parser(HermesParser):
    name = "qwen25"


class Llama3JsonParser(ToolCallParser):
    name = "llama3_json"
    start = "<|python_tag|>"
    _call_head = re.compile(r'\s*(<\|python_tag\|>)?\s*\{\s*"name"')  # an object that begins as a call

    def markup_start(self, text: str) -> int:
        """Calls are bare JSON objects: markup only where an object begins as a call (JSON
        content, a ``response_format`` answer beside tools, stays), or where the answer is the
        python tag or its first characters at the end."""
        return 0 if self._call_head.match(text) else super().markup_start(text)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        body = text.strip()
        body = body[len(self.start):].lstrip() if body.startswith(self.start) else body
        if not body.startswith("{"):
            return text, []
        found, rest = _leading_objects(body, 0, " \n\t;")
        calls = [_call_from(obj, "parameters", raw) for obj, raw in found] + _cut_off(body[rest:])
        if not calls or any(c is None for c in calls):  # (a last call cut inside its arguments is left out)
            return text, []
        return "", calls  # type: ignore[return-value]


class MistralParser(ToolCallParser):
    name = "mistral"
    start = "[TOOL_CALLS]"

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        cut = text.find(self.start)
        if cut < 0:
            return text, []
        body = text[cut + len(self.start):].strip()
        # the calls one by one (with their text), as far as they are whole (max_tokens may cut the list)
        found, rest = _leading_objects(body, 1 if body.startswith("[") else 0, " \n\t,")
        try:
            items, cut_off = json.loads(body), []
        except json.JSONDecodeError:
            items, cut_off = [obj for obj, _ in found], _cut_off(body[rest:])
        items = items if isinstance(items, list) else [items]
        texts = [raw for _, raw in found] if len(found) == len(items) else [None] * len(items)
        calls = [_call_from(obj, "arguments", raw) for obj, raw in zip(items, texts, strict=True)] + cut_off
        if not calls or any(c is None for c in calls):
            return text, []
        return text[:cut].rstrip(), calls  # type: ignore[return-value]


def _leading_objects(body: str, pos: int, separators: str) -> tuple[list[tuple[object, str]], int]:
    """The JSON values written one after another from ``body[pos]``, any of ``separators``
    between them, up to the first that does not decode (the end, or a value cut off); each
    with its text; and where that first undecoded one begins."""
    decoder, items = json.JSONDecoder(), []
    while True:
        while pos < len(body) and body[pos] in separators:
            pos += 1
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return items, pos
        items.append((obj, body[pos:end]))
        pos = end


def _cut_off(rest: str) -> list[ParsedCall]:
    """What follows the whole calls: nothing, a call cut off after its arguments (kept), or
    one cut off before (left out)."""
    if not rest.strip():
        return []
    call = call_cut_after_arguments(rest)
    return [call] if call is not None else []


PARSERS: dict[str, type[ToolCallParser]] = {
    p.name: p for p in (HermesParser, Qwen25Parser, Llama3JsonParser, MistralParser)
}


def get_parser(name: str, chat_template: str | None = None) -> ToolCallParser:
    """The parser ``name`` (``--tool-call-parser``); ``auto``: the one ``chat_template`` implies."""
    if name == "auto":
        return parser_for_template(chat_template)
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose from {', '.join(PARSERS)}")
    return PARSERS[name]()


def parser_for_template(chat_template: str | None) -> ToolCallParser:
    """``auto``: the format a chat template asks its model to write calls in."""
    t = chat_template or ""
    if "[TOOL_CALLS]" in t:
        return MistralParser()
    if "<|python_tag|>" in t or "ipython" in t:
        return Llama3JsonParser()
    return HermesParser()  # also the format of the template shipped for models without one


@dataclass
class _StreamedCall:
    id: str
    arguments: str = ""  # the argument text sent so far


class StreamingToolParser:
    """Feeds on the cumulative text; yields content deltas and tool-call deltas in OpenAI's
    shape. Text that may be the start of the call markup is held back; once markup has
    started, nothing more goes to content. Each call is announced (index, id, type, name)
    as soon as its name is written, then its arguments follow in fragments as the model
    writes them. At the end the whole parse has the last word: a call it has that the
    stream has not shown completely (arguments first, or written as a string) is sent then.
    A last call cut off by max_tokens inside its arguments stays as far as it was streamed
    (finish_reason ``length``), as in the whole answer (``chat_answer.streamed_calls``). Markup that never parses as a call
    (no call announced) is content in the end, as in the whole parse, unless max_tokens cut
    the answer inside it (``markup_start``): then, as in the whole answer, it is dropped. A call announced
    that the whole parse then rejects cannot be taken back."""

    def __init__(self, parser: ToolCallParser) -> None:
        self.parser = parser
        self.shown = 0  # content characters sent
        self.in_calls = False
        self.calls: list[_StreamedCall] = []

    @property
    def sent_calls(self) -> int:
        return len(self.calls)

    def feed(self, text: str, finished: bool, cut_off: bool = False) -> tuple[str, list[dict]]:
        """The deltas for the cumulative ``text``; ``cut_off``: it ended at ``max_tokens``."""
        shown_before = self.shown
        start = self.parser.start
        cut = text.find(start) if start else -1
        if isinstance(self.parser, Llama3JsonParser) and text.lstrip().startswith("{"):
            cut = 0
        content_end = cut if cut >= 0 else len(text)
        # hold back a tail that may grow into the start marker (and the whitespace that may
        # precede it); an answer cut off there drops it, as the whole answer does
        if cut < 0 and (not finished or cut_off) and (partial := partial_marker_at(text, start)) >= 0:
            content_end = len(text[:partial].rstrip())
        elif cut < 0 and not finished:
            content_end = len(text.rstrip())
        delta = text[self.shown:content_end] if content_end > self.shown else ""
        if cut >= 0:  # the whitespace before the markup is not content (unless the markup never parses)
            delta = delta.rstrip()
        self.shown += len(delta)
        calls: list[dict] = []
        if cut >= 0:
            self.in_calls = True
            self._stream_calls(text, cut, calls)
            if finished:
                self._complete_calls(text, calls)
                if not self.calls and not (cut_off and self.parser.markup_start(text) >= 0):
                    # the markup never parsed: what was held back is content after all
                    # (a first call cut off by max_tokens is dropped, as the whole answer drops it)
                    content, _ = self.parser.parse(text)
                    delta, self.shown = content[shown_before:], len(content)
        return delta, calls

    def _stream_calls(self, text: str, cut: int, out: list[dict]) -> None:
        """Deltas for the call objects written so far after the markup's start."""
        pos, index = cut, 0
        while (begin := text.find("{", pos)) >= 0:
            end = json_value_end(text, begin)
            head = _HEAD.match(text, begin)
            if head is None:
                break  # not (yet) a call written name first: the whole parse will tell
            if index == len(self.calls):
                try:
                    name = json.loads('"' + head.group(1) + '"')
                except json.JSONDecodeError:
                    break  # a name that is no JSON string: no call (the whole parse drops it too)
                self.calls.append(_StreamedCall(f"call_{uuid.uuid4().hex[:24]}"))
                out.append({"index": index, "id": self.calls[index].id, "type": "function",
                            "function": {"name": name, "arguments": ""}})
            args_at = head.end()
            if args_at < len(text) and text[args_at] == "{":
                args_end = json_value_end(text, args_at) or len(text)
                self._send_arguments(index, text[args_at:args_end], out)
            if end is None:
                break
            pos, index = end, index + 1

    def _complete_calls(self, text: str, out: list[dict]) -> None:
        """At the end: what the whole parse has that the stream did not show."""
        _, parsed = self.parser.parse(text)
        for index, call in enumerate(parsed):
            if index == len(self.calls):
                self.calls.append(_StreamedCall(call.id))
                out.append({"index": index, "id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": ""}})
            self._send_arguments(index, call.arguments, out)

    def _send_arguments(self, index: int, arguments: str, out: list[dict]) -> None:
        sent = self.calls[index].arguments
        if len(arguments) > len(sent) and arguments.startswith(sent):
            if out and out[-1]["index"] == index:  # one entry per call in a chunk, as OpenAI sends
                out[-1]["function"]["arguments"] += arguments[len(sent):]
            else:
                out.append({"index": index, "function": {"arguments": arguments[len(sent):]}})
            self.calls[index].arguments = arguments
