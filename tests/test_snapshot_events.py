"""``SnapshotEvents`` (runtime/server/responses_events.py): a response's events built from
successive stored snapshots of it, as a stream on a server that does not run a background
response sees them, must say what the events of the final response replayed at once say:
the same items, each item's text and arguments (the deltas add up), the same statuses and
the same end; only how the deltas are cut differs."""

from __future__ import annotations

import json

from runtime.server.responses_events import SnapshotEvents, replayed_events


def _message(text, status, k=0):
    return {"type": "message", "id": f"msg_{k}", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call(arguments, status, k=0):
    return {"type": "function_call", "id": f"fc_{k}", "call_id": f"call_{k}", "name": "f", "arguments": arguments,
            "status": status}


def _body(status, output):
    return {"id": "resp_1", "object": "response", "status": status, "output": output, "usage": None}


SNAPSHOTS = [  # as a running server writes them: items grow, then close, in output order
    _body("in_progress", []),
    _body("in_progress", [_message("Hel", "in_progress")]),
    _body("in_progress", [_message("Hello, wor", "in_progress")]),
    _body("in_progress", [_message("Hello, world.", "completed"), _call('{"a":', "in_progress")]),
    _body("in_progress", [_message("Hello, world.", "completed"), _call('{"a": 1}', "in_progress")]),
    _body("completed", [_message("Hello, world.", "completed"), _call('{"a": 1}', "completed"),
                        _message("Bye.", "completed", k=1)]),
]


def _summary(chunks):
    """(type, item id, delta) of each event, the deltas of each item joined, the last event."""
    frames = [c.decode().strip().split("\n") for c in chunks]  # each: "event: <type>", "data: <json>"
    events = [json.loads(data.removeprefix("data: ")) for _, data in frames]
    assert [name.removeprefix("event: ") for name, _ in frames] == [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas: dict[int, str] = {}
    for e in events:
        if e["type"].endswith(".delta"):
            deltas[e["output_index"]] = deltas.get(e["output_index"], "") + e["delta"]
    kinds = [e["type"] for e in events if not e["type"].endswith(".delta")]
    done = [(e["output_index"], e["item"]["status"]) for e in events if e["type"] == "response.output_item.done"]
    return kinds, deltas, done, events[-1]


def test_snapshots_tell_what_the_final_response_replayed_tells():
    follower = SnapshotEvents(SNAPSHOTS[0])
    chunks = follower.start()
    per_snapshot = []
    for body in SNAPSHOTS[:-1]:
        new = follower.update(body)
        per_snapshot.append(len(new))
        chunks += new
    chunks += follower.end(SNAPSHOTS[-1])
    followed, replayed = _summary(chunks), _summary(replayed_events(SNAPSHOTS[-1]))
    assert followed[1] == replayed[1] == {0: "Hello, world.", 1: '{"a": 1}', 2: "Bye."}
    assert followed[2] == replayed[2] == [(0, "completed"), (1, "completed"), (2, "completed")]
    assert followed[3]["type"] == "response.completed" and followed[3]["response"]["output"][2]["id"] == "msg_1"
    assert sorted(followed[0]) == sorted(replayed[0])  # the same events but the deltas, maybe in another order
    assert per_snapshot[0] == 0 and all(n > 0 for n in per_snapshot[1:])  # each write's news went out at once


def test_a_second_item_of_one_kind_grows_across_writes():
    """Text after a call opens a second message item; while it grows, the first (closed)
    one must neither be written to again nor close it."""
    first, call = _message("Hi.", "completed"), _call("{}", "completed")
    snapshots = [_body("in_progress", [first, call, _message("Th", "in_progress", k=1)]),
                 _body("in_progress", [first, call, _message("There", "in_progress", k=1)]),
                 _body("completed", [first, call, _message("There, done.", "completed", k=1)])]
    follower = SnapshotEvents(snapshots[0])
    chunks = [*follower.start(), *follower.update(snapshots[0]), *follower.update(snapshots[1])]
    chunks += follower.end(snapshots[2])
    _, deltas, done, last = _summary(chunks)
    assert deltas == {0: "Hi.", 1: "{}", 2: "There, done."} == _summary(replayed_events(snapshots[2]))[1]
    assert done == [(0, "completed"), (1, "completed"), (2, "completed")]
    assert last["type"] == "response.completed"


def test_a_cancelled_response_closes_its_items_and_has_no_end_event():
    follower = SnapshotEvents(SNAPSHOTS[0])
    chunks = [*follower.start(), *follower.update(SNAPSHOTS[2])]
    chunks += follower.end(_body("cancelled", [_message("Hello, wor", "incomplete")]))
    kinds, deltas, done, last = _summary(chunks)
    assert deltas == {0: "Hello, wor"} and done == [(0, "incomplete")]
    assert last["type"] == "response.output_item.done" and "response.cancelled" not in kinds
