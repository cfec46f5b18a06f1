"""``--reasoning-parser``: the text a reasoning model writes between its think markers goes
to ``message.reasoning_content`` (and ``reasoning_content`` deltas when streaming), the rest
to ``content``. ``deepseek-r1``: the template opens the thinking, so text before ``</think>``
is reasoning even without a ``<think>``; ``qwen3``: only text after a leading ``<think>``.
A request's ``separate_reasoning: false`` (SGLang's field) keeps everything in ``content``;
``stream_reasoning: false`` (SGLang's too) streams no reasoning as it is written: all of it
comes in one ``reasoning_content`` delta when the thinking ends (or the answer does)."""

from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    opens_itself: bool  # the model writes <think>; otherwise the template already opened it

    def split(self, text: str, finished: bool = True) -> tuple[str, str, bool]:
        """(reasoning, content, closed) of ``text`` so far; ``closed``: the end marker was seen."""
        body = text
        if body.lstrip().startswith(START):
            body = body.lstrip()[len(START):]
        elif self.opens_itself:
            return "", text, True  # no thinking at all
        cut = body.find(END)
        if cut < 0:
            return body, "", False
        return body[:cut], body[cut + len(END):].lstrip(), True


PARSERS = {"deepseek-r1": ReasoningParser("deepseek-r1", opens_itself=False),
           "qwen3": ReasoningParser("qwen3", opens_itself=True),
           # SGLang's other names for the same markers and rules
           "qwen3-thinking": ReasoningParser("qwen3-thinking", opens_itself=False),
           "step3": ReasoningParser("step3", opens_itself=False)}


class StreamingReasoning:
    """Cumulative text in, reasoning and content deltas out; a tail that may be the start of
    the end marker is held back until it is known. With ``stream`` false the reasoning is
    held back until it is complete."""

    def __init__(self, parser: ReasoningParser, stream: bool = True) -> None:
        self.parser = parser
        self.stream = stream
        self.sent_reasoning = 0
        self.content = ""  # all content so far (for a tool-call parser to read)

    def feed(self, text: str, finished: bool) -> tuple[str, str]:
        """(reasoning delta, content delta) for the cumulative ``text``."""
        head = text.lstrip()
        if not finished and len(head) < len(START) and START.startswith(head):
            return "", ""  # "<thi": not known yet whether thinking starts
        reasoning, content, closed = self.parser.split(text, finished)
        if not (closed or finished or self.stream):
            return "", ""
        if not closed and not finished:
            for k in range(min(len(END) - 1, len(reasoning)), 0, -1):
                if reasoning.endswith(END[:k]):
                    reasoning = reasoning[:-k]
                    break
        r_delta = reasoning[self.sent_reasoning:]
        self.sent_reasoning = max(self.sent_reasoning, len(reasoning))
        c_delta = content[len(self.content):]
        self.content = max(self.content, content, key=len)
        return r_delta, c_delta
