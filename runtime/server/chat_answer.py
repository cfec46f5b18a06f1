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
        # whether the last ``message`` left out a call max_tokens cut (one a stream has shown)
        self.dropped_cut_call = False

    @property
    def is_plain(self) -> bool:
        """Nothing to split: the text is the content."""
        return self.tool_parser is None and self.reasoning is None

    def message(self, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        """The assistant message for the whole ``text``, and the finish reason (``calls_finish``
        when the answer stopped on its own after calls)."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        self.dropped_cut_call = False
        if self.reasoning is not None:
            reasoning, message["content"], _ = self.reasoning.split(text)
            message["reasoning_content"] = (reasoning or None) if self.include_reasoning else None
        if self.tool_parser is not None:
            content, calls = self.tool_parser.parse(message["content"])
            if calls:
                message.update(content=content or None, tool_calls=[c.as_openai() for c in calls])
                finish = self.calls_finish if finish == "stop" else finish
            elif finish == "length" and (start := self.tool_parser.markup_start(content)) >= 0:
                message["content"] = content[:start].rstrip() or None  # its only call, cut off: dropped
                shown = StreamingToolParser(self.tool_parser)  # had a stream shown it (its name written)?
                shown.feed(content, finished=True, cut_off=True)
                self.dropped_cut_call = shown.sent_calls > 0
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
