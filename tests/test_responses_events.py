"""The Responses API's streamed output items and their events (no model): items end in
order, as OpenAI streams them; a call whose arguments are not yet whole stays open."""

from __future__ import annotations

import json

from runtime.server.responses_events import OutputItems, StreamedOutput


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
