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


def _call_from(obj: object, args_key: str) -> ParsedCall | None:
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
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallParser(ABC):
    name = ""
    # text that opens the call markup; content before it is the message's text
    start: str = ""

    @abstractmethod
    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        """(content, calls). Markup that does not parse stays in the content."""


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
                call = _call_from(json.loads(m.group(1)), "arguments")
            except json.JSONDecodeError:
                call = None
            if call is None:
                if not m.group(2) and calls:  # a last call cut off (max_tokens): the others stand
                    break
                return text, []
            calls.append(call)
        return text[:cut].rstrip(), calls


class Qwen25Parser(HermesParser):
    name = "qwen25"


class Llama3JsonParser(ToolCallParser):
    name = "llama3_json"
    start = "<|python_tag|>"

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        body = text.strip()
        body = body[len(self.start):] if body.startswith(self.start) else body
        if not body.startswith("{"):
            return text, []
        calls = [_call_from(obj, "parameters") for obj in _leading_objects(body, 0, " \n\t;")]
        if not calls or any(c is None for c in calls):  # a last call cut off (max_tokens) is left out
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
        try:
            items = json.loads(body)
        except json.JSONDecodeError:
            # a list cut off (max_tokens): its whole calls
            items = _leading_objects(body, 1, " \n\t,") if body.startswith("[") else []
        items = items if isinstance(items, list) else [items]
        calls = [_call_from(obj, "arguments") for obj in items]
        if not calls or any(c is None for c in calls):
            return text, []
        return text[:cut].rstrip(), calls  # type: ignore[return-value]


def _leading_objects(body: str, pos: int, separators: str) -> list[object]:
    """The JSON values written one after another from ``body[pos]``, any of ``separators``
    between them, up to the first that does not decode (the end, or a value cut off)."""
    decoder, items = json.JSONDecoder(), []
    while True:
        while pos < len(body) and body[pos] in separators:
            pos += 1
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return items
        items.append(obj)


PARSERS: dict[str, type[ToolCallParser]] = {
    p.name: p for p in (HermesParser, Qwen25Parser, Llama3JsonParser, MistralParser)
}


def get_parser(name: str) -> ToolCallParser:
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


class StreamingToolParser:
    """Feeds on the cumulative text; yields content deltas and tool-call deltas in OpenAI's
    shape. Text that may be the start of the call markup is held back; once markup has
    started, nothing more goes to content, and each call is announced (index, id, name)
    and then given its arguments when its markup has closed."""

    def __init__(self, parser: ToolCallParser) -> None:
        self.parser = parser
        self.shown = 0  # content characters sent
        self.in_calls = False
        self.sent_calls = 0

    def feed(self, text: str, finished: bool) -> tuple[str, list[dict]]:
        start = self.parser.start
        cut = text.find(start) if start else -1
        if isinstance(self.parser, Llama3JsonParser) and text.lstrip().startswith("{"):
            cut = 0
        content_end = cut if cut >= 0 else len(text)
        if cut < 0 and not finished:  # hold back a tail that may grow into the start marker,
            for k in range(min(len(start) - 1, len(text)), 0, -1):
                if text.endswith(start[:k]):
                    content_end = len(text) - k
                    break
            content_end = len(text[:content_end].rstrip())  # and whitespace that may precede it
        delta = text[self.shown:content_end] if content_end > self.shown else ""
        if cut >= 0:  # the whitespace before the markup is not content
            delta = delta.rstrip()
        self.shown = max(self.shown, content_end)
        calls: list[dict] = []
        if cut >= 0:
            self.in_calls = True
            _, parsed = self.parser.parse(text if finished else self._closed_part(text))
            for i in range(self.sent_calls, len(parsed)):
                c = parsed[i]
                calls.append({"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}})
                calls.append({"index": i, "function": {"arguments": c.arguments}})
            self.sent_calls = max(self.sent_calls, len(parsed))
        return delta, calls

    def _closed_part(self, text: str) -> str:
        """The text up to the last complete call block (formats with an end marker)."""
        end = getattr(self.parser, "end", None)
        if end is None:
            return ""
        last = text.rfind(end)
        return text[: last + len(end)] if last >= 0 else ""
