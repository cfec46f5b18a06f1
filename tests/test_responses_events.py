"""The Responses API's streamed output items and their events (no model): items end in
order, as OpenAI streams them; a call whose arguments are not yet whole stays open; an
answer cut by max_output_tokens ends with the same items whole as streamed."""

from __future__ import annotations

import json

import pytest

from runtime.server.chat_answer import ChatAnswer
from runtime.server.reasoning import PARSERS as REASONING_PARSERS
from runtime.server.responses_events import OutputItems, StreamedOutput
from runtime.server.tools.parsers import get_parser


class _Items(OutputItems):
    hex = "abc"


def _events(chunks: list[bytes]) -> list[tuple[str, int | None]]:
    out = []
    for chunk in chunks:
        data = json.loads(chunk.decode().split("data: ", 1)[1])
        out.append((data["type"].removeprefix("response."), data.get("output_index")))
    return out


def _call(index: int, name: str) -> dict:
    return {"index": index, "id": f"call_{index}", "function": {"name": name, "arguments": ""}}


def _args(index: int, text: str) -> dict:
    return {"index": index, "function": {"arguments": text}}


def test_parallel_calls_end_one_after_the_other():
    out = StreamedOutput(_Items())
    events = _events([*out.text("message", "Let me check.", None),
                      *out.calls([_call(0, "weather")]), *out.calls([_args(0, '{"city": ')]),
                      *out.calls([_args(0, '"Paris"}')]),
                      *out.calls([_call(1, "time")]), *out.calls([_args(1, '{"tz": "UTC"}')]),
                      *out.close()])
    item_events = [(kind, i) for kind, i in events if kind.startswith(("output_item", "function_call_arguments.done"))]
    assert item_events == [("output_item.added", 0), ("output_item.done", 0),
                           ("output_item.added", 1), ("function_call_arguments.done", 1), ("output_item.done", 1),
                           ("output_item.added", 2), ("function_call_arguments.done", 2), ("output_item.done", 2)]
    assert [it["status"] for it in out.items] == ["completed"] * 3
    assert [it.get("arguments") for it in out.items[1:]] == ['{"city": "Paris"}', '{"tz": "UTC"}']


def test_a_call_whose_arguments_come_only_at_the_end_stays_open_until_then():
    out = StreamedOutput(_Items())
    chunks = [*out.calls([_call(0, "weather")]), *out.calls([_call(1, "time")])]  # arguments not shown yet
    assert ("output_item.done", 0) not in _events(chunks)
    ends = _events([*out.calls([_args(0, '{"city": "Paris"}'), _args(1, "{}")]), *out.close()])
    assert ends[-4:] == [("function_call_arguments.done", 0), ("output_item.done", 0),
                         ("function_call_arguments.done", 1), ("output_item.done", 1)]


def test_items_end_in_output_order_when_an_earlier_calls_arguments_come_last():
    out = StreamedOutput(_Items())
    chunks = [*out.calls([_call(0, "weather")]),  # arguments only from the final parse (a string)
              *out.calls([_call(1, "time")]), *out.calls([_args(1, "{}")]),
              *out.calls([_call(2, "date")]), *out.calls([_args(2, "{}")]),
              *out.calls([_args(0, '{"city": "Paris"}')]), *out.close()]
    done = [i for kind, i in _events(chunks) if kind == "output_item.done"]
    assert done == [0, 1, 2]


def _streamed_items(answer, text: str) -> list[dict]:
    """The items a stream of ``text`` ends with under max_output_tokens, fed a character at a
    time through the chat answer's deltas as the Responses route feeds them."""
    out = StreamedOutput(_Items())
    for k in range(1, len(text) + 1):
        delta, _ = answer.delta(0, text[:k], "length" if k == len(text) else None)
        delta = delta or {}
        out.text("reasoning", delta.get("reasoning_content"), None)
        out.text("message", delta.get("content"), None)
        out.calls(delta.get("tool_calls") or [])
    out.close(incomplete=True)
    return out.items


@pytest.mark.parametrize("text", [
    'Let me check. <tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
    '<think>The user wants weather.</think>Sure. <tool_call>{"name": "weather", "arguments": {"city": "Rome"}}',
])
def test_an_answer_cut_anywhere_has_the_same_items_and_statuses_streamed_or_not(text):
    """Cut by max_output_tokens at every character: the whole answer's items (kind, status,
    text or arguments) are the stream's, a last call the limit cut inside its arguments
    included (incomplete; it was left out, leaving an empty output); the item the limit
    cut is the one incomplete."""
    for k in range(1, len(text) + 1):
        cut = text[:k]
        message, finish = ChatAnswer(get_parser("hermes"), REASONING_PARSERS["deepseek-r1"]).message(cut, "length")
        whole = _Items().whole_items(message, None, finish)
        streamed = _streamed_items(ChatAnswer(get_parser("hermes"), REASONING_PARSERS["deepseek-r1"]), cut)

        def summary(items):
            return [(i["type"], i["status"], i.get("arguments") or i.get("content", [{}])[0].get("text"))
                    for i in items]

        assert summary(whole) == summary(streamed), cut
