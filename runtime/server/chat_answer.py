"""What the chat route makes of a choice's text besides plain content: the reasoning split off
(``--reasoning-parser``, unless ``separate_reasoning`` is false; dropped where
``include_reasoning`` is false) and the tool calls parsed out
(``tools``), for the whole answer (``message``) and as streaming deltas (``delta``; with
``stream_reasoning`` false the reasoning comes in one delta once it is complete)."""

from __future__ import annotations

from typing import Any

from runtime.server.reasoning import ReasoningParser, StreamingReasoning
from runtime.server.tools.parsers import StreamingToolParser, ToolCallParser


class ChatAnswer:
    def __init__(self, tool_parser: ToolCallParser | None, reasoning: ReasoningParser | None,
                 stream_reasoning: bool = True, calls_finish: str = "tool_calls", include_reasoning: bool = True) -> None:
        self.tool_parser, self.reasoning, self.stream_reasoning = tool_parser, reasoning, stream_reasoning
        self.include_reasoning = include_reasoning  # false (vLLM's): the reasoning is split off and dropped
        # an answer that stopped on its own after calls finishes so: "tool_calls", or "stop"
        # where tool_choice named the function (OpenAI's forced function; vLLM does the same)
        self.calls_finish = calls_finish
        self.tool_streams: dict[int, StreamingToolParser] = {}
        self.reasoning_streams: dict[int, StreamingReasoning] = {}

    @property
    def is_plain(self) -> bool:
        """Nothing to split: the text is the content."""
        return self.tool_parser is None and self.reasoning is None

    def message(self, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        """The assistant message for the whole ``text``, and the finish reason (``calls_finish``
        when the answer stopped on its own after calls)."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.reasoning is not None:
            reasoning, message["content"], _ = self.reasoning.split(text)
            message["reasoning_content"] = (reasoning or None) if self.include_reasoning else None
        if self.tool_parser is not None:
            text = message["content"]
            content, parsed = self.tool_parser.parse(text)
            calls = [c.as_openai() for c in parsed]
            if finish == "length":  # a last call cut inside its arguments: as far as it was written,
                cut = streamed_calls(self.tool_parser, text)[len(calls):]  # as a stream shows it (and OpenAI)
                if not calls and (start := self.tool_parser.markup_start(text)) >= 0:
                    content = text[:start].rstrip()  # markup cut before a call's name: dropped
                calls += cut
            if calls:
                message.update(content=content or None, tool_calls=calls)
                finish = self.calls_finish if finish == "stop" else finish
            elif finish == "length" and content != text:
                message["content"] = content or None
        return message, finish

    def delta(self, index: int, text: str, finish: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """The delta of choice ``index`` for its cumulative ``text`` (None: nothing to send yet),
        and the finish reason."""
        finished = finish is not None
        reasoning, content, calls, answer = "", "", [], text
        if self.reasoning is not None:
            thinking = self.reasoning_streams.setdefault(index, StreamingReasoning(self.reasoning, self.stream_reasoning))
            reasoning, content = thinking.feed(text, finished)
            reasoning, answer = reasoning if self.include_reasoning else "", thinking.content
        if self.tool_parser is not None:
            stream = self.tool_streams.setdefault(index, StreamingToolParser(self.tool_parser))
            content, calls = stream.feed(answer, finished, cut_off=finish == "length")
            if finish == "stop" and stream.sent_calls:
                finish = self.calls_finish
        if not (reasoning or content or calls or finished):
            return None, finish
        delta: dict[str, Any] = {"reasoning_content": reasoning} if reasoning else {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta, finish


def streamed_calls(parser: ToolCallParser, text: str) -> list[dict[str, Any]]:
    """The calls a stream of the whole ``text``, cut off by max_tokens, shows (a call once its
    name is written; its arguments as far as they are), in OpenAI's shape."""
    calls: list[dict[str, Any]] = []
    for delta in StreamingToolParser(parser).feed(text, finished=True, cut_off=True)[1]:
        if delta["index"] == len(calls):
            calls.append({"id": delta["id"], "type": "function", "function": {**delta["function"]}})
        else:
            calls[delta["index"]]["function"]["arguments"] += delta["function"].get("arguments", "")
    return calls
