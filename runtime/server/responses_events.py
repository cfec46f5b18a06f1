"""The Responses API's output items and their streaming events: the items a response is
made of (``OutputItems``), the events that announce them as they grow (``StreamedOutput``),
and a stored response sent again as events (``SnapshotEvents``, ``replayed_events``)."""

from __future__ import annotations

import json
import time
from typing import Any

from runtime.server.responses import sse

# The two kinds of text item: their part type, and the prefix of their delta / done events.
TEXT_ITEMS = {"message": ("output_text", "response.output_text"), "reasoning": ("reasoning_text", "response.reasoning_text")}
# Finish reasons of an answer cut off before its end: its last item is incomplete.
CUT_OFF = ("length", "abort")


class OutputItems:
    """The output items of the response whose id is ``resp_<hex>``; their ids follow from it."""

    hex: str

    def text_item(self, kind: str, text: str, logprobs: list[dict[str, Any]] | None = None,
                  status: str = "completed") -> dict[str, Any]:
        part: dict[str, Any] = {"type": TEXT_ITEMS[kind][0], "text": text}
        if kind == "message":
            part.update(annotations=[], logprobs=logprobs or [])
            return {"type": "message", "id": f"msg_{self.hex}", "status": status, "role": "assistant", "content": [part]}
        return {"type": "reasoning", "id": f"rs_{self.hex}", "status": status, "summary": [], "content": [part]}

    def call_item(self, k: int, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
        return {"type": "function_call", "id": f"fc_{self.hex}_{k}", "call_id": call_id, "name": name,
                "arguments": arguments, "status": status}

    def whole_items(self, message: dict[str, Any], logprobs: list[dict[str, Any]] | None,
                    finish: str | None) -> list[dict[str, Any]]:
        """A whole chat answer's items: its reasoning, its text, its calls; under
        ``max_output_tokens`` (or ended by ``/abort_request``) the item that was cut is
        incomplete (a text, or a call cut inside its arguments), as the stream ends them."""
        output = []
        if message.get("reasoning_content"):
            output.append(self.text_item("reasoning", message["reasoning_content"]))
        if message["content"]:
            output.append(self.text_item("message", message["content"], logprobs or []))
        for k, call in enumerate(message.get("tool_calls") or []):
            output.append(self.call_item(k, call["id"], call["function"]["name"], call["function"]["arguments"]))
        if finish in CUT_OFF and output and (output[-1]["type"] != "function_call"
                                              or not whole_arguments(output[-1]["arguments"])):
            output[-1]["status"] = "incomplete"
        return output

    _completed_at: int | None = None

    def completed_at(self) -> int:
        """When the response completed (set the first time a completed body is made)."""
        if self._completed_at is None:
            self._completed_at = int(time.time())
        return self._completed_at

    def body(self, output: list[dict[str, Any]], status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        raise NotImplementedError


class StreamedOutput:
    """A streamed response's output items as they grow, and the events that announce them."""

    def __init__(self, creation: OutputItems) -> None:
        self.creation = creation
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, int] = {}  # text item kind, or "call <k>" -> its output index
        self.sequence = 0
        self.failed_body: dict[str, Any] | None = None  # the response as failed, once it has

    def event(self, kind: str, **fields: Any) -> bytes:
        """One server-sent event, named by its type on an ``event:`` line as OpenAI sends it
        (clients that dispatch on event names need it; the SDK reads ``type``)."""
        self.sequence += 1
        return b"event: " + kind.encode() + b"\n" + sse({"type": kind, "sequence_number": self.sequence - 1, **fields})

    def failed(self, status: int, message: str) -> bytes:
        code = "server_error" if status >= 500 else "invalid_prompt"
        self.failed_body = {**self.creation.body(self.items, "failed", None), "error": {"code": code, "message": message}}
        return self.event("response.failed", response=self.failed_body)

    def _add(self, key: str, item: dict[str, Any]) -> list[bytes]:
        """Open a new item, closing first the open text items and the calls whose arguments
        are whole (a JSON object: nothing more can come), so that items end in order, as
        OpenAI streams them; a call whose arguments are not yet whole (written as a string,
        sent only by the final parse) stays open until they are or the answer ends."""
        chunks = self.close(only_text=True)
        for open_key, index in sorted(self.open.items(), key=lambda kv: kv[1]):  # calls in output order,
            if not whole_arguments(self.items[index]["arguments"]):  # up to the first not yet whole
                break
            chunks += self.close_item(open_key, "completed")
        self.open[key] = len(self.items)
        self.items.append(item)
        return [*chunks, self.event("response.output_item.added", output_index=self.open[key],
                                    item={**item, "content": []} if "content" in item else dict(item))]

    def text(self, kind: str, delta: str | None, logprobs: list[dict[str, Any]] | None) -> list[bytes]:
        if not delta:
            return []
        chunks: list[bytes] = []
        if kind not in self.open:
            chunks += self._add(kind, self.creation.text_item(kind, "", status="in_progress"))
            index = self.open[kind]
            chunks.append(self.event("response.content_part.added", item_id=self.items[index]["id"], output_index=index,
                                     content_index=0, part=self.items[index]["content"][0]))
        index = self.open[kind]
        part = self.items[index]["content"][0]
        part["text"] += delta
        fields: dict[str, Any] = {"delta": delta}
        if kind == "message":
            part["logprobs"] += logprobs or []
            fields["logprobs"] = logprobs or []
        return [*chunks, self.event(TEXT_ITEMS[kind][1] + ".delta", item_id=self.items[index]["id"], output_index=index,
                                    content_index=0, **fields)]

    def calls(self, deltas: list[dict[str, Any]]) -> list[bytes]:
        chunks: list[bytes] = []
        for d in deltas:
            key, function = f"call {d['index']}", d.get("function") or {}
            if "id" in d:
                item = self.creation.call_item(d["index"], d["id"], function.get("name", ""), "", status="in_progress")
                chunks += self._add(key, item)
            pieces = function.get("arguments") or ""
            if pieces and key in self.open:
                index = self.open[key]
                self.items[index]["arguments"] += pieces
                chunks.append(self.event("response.function_call_arguments.delta", item_id=self.items[index]["id"],
                                         output_index=index, delta=pieces))
        return chunks

    def close(self, only_text: bool = False, incomplete: bool = False,
              logprobs: list[dict[str, Any]] | None = None) -> list[bytes]:
        """Close the open items (or only the text ones), in output order: ``incomplete`` when
        the answer ran out of tokens, except a call whose arguments are whole (only its
        closing markup was cut); ``logprobs``: the message's, whole."""
        chunks: list[bytes] = []
        for key, index in sorted(self.open.items(), key=lambda kv: kv[1]):
            if not only_text or key in TEXT_ITEMS:
                cut = incomplete and (key in TEXT_ITEMS or not whole_arguments(self.items[index]["arguments"]))
                chunks += self.close_item(key, "incomplete" if cut else "completed", logprobs)
        return chunks

    def close_item(self, key: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> list[bytes]:
        """Close one open item (a text kind, or ``call <k>``) with ``status``."""
        index = self.open.pop(key)
        item = self.items[index]
        item["status"] = status
        chunks: list[bytes] = []
        if key in TEXT_ITEMS:
            part = item["content"][0]
            if key == "message" and logprobs is not None:
                part["logprobs"] = logprobs
            done = {"logprobs": part["logprobs"]} if key == "message" else {}
            chunks.append(self.event(TEXT_ITEMS[key][1] + ".done", item_id=item["id"], output_index=index,
                                     content_index=0, text=part["text"], **done))
            chunks.append(self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                     content_index=0, part=part))
        else:
            chunks.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=index, name=item["name"], arguments=item["arguments"]))
        chunks.append(self.event("response.output_item.done", output_index=index, item=item))
        return chunks


def whole_arguments(arguments: str) -> bool:
    """A function call's arguments are whole once they are a JSON object: the item is
    then ``completed`` and part of the stored conversation (a call cut off is neither)."""
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


class SnapshotSource(OutputItems):
    """A stored response (a snapshot of one), as the source of its events again."""

    def __init__(self, stored: dict[str, Any]) -> None:
        self.stored, self.hex = stored, stored["id"].removeprefix("resp_")

    def body(self, output: list[dict[str, Any]], status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        return {**self.stored, "output": output, "status": status, "usage": usage, "incomplete_details": None}


class SnapshotEvents:
    """The events of a stored response, from successive snapshots of it, each holding at
    least the output of the one before: all at once for one that has ended
    (``replayed_events``), or step by step as a background response running on another
    server grows (its server writes it again every few seconds). Each item is opened, its
    text or arguments sent as they grow, and closed with its stored status."""

    def __init__(self, first: dict[str, Any]) -> None:
        self.source = SnapshotSource(first)
        self.out = StreamedOutput(self.source)
        self.keys: list[str] = []  # each opened item's key in ``out.open``, in output order

    def start(self) -> list[bytes]:
        body = self.source.body([], "in_progress", None)
        return [self.out.event(kind, response=body) for kind in ("response.created", "response.in_progress")]

    def update(self, body: dict[str, Any]) -> list[bytes]:
        """Events for what ``body`` holds beyond what was sent."""
        self.source.stored = body
        chunks: list[bytes] = []
        for index, item in enumerate(body["output"]):
            if index == len(self.keys):  # a new item (a text one has its first text by now)
                calls = sum(k.startswith("call ") for k in self.keys)
                self.keys.append(item["type"] if item["type"] in TEXT_ITEMS else f"call {calls}")
                if item["type"] not in TEXT_ITEMS:
                    chunks += self.out.calls([{"index": calls, "id": item["call_id"],
                                               "function": {"name": item["name"], "arguments": ""}}])
            key = self.keys[index]  # (several items can share a key: one open at a time)
            if index < len(self.out.items) and self.out.open.get(key) != index:
                continue  # closed already
            sent = self.out.items[index] if index < len(self.out.items) else None
            if key in TEXT_ITEMS:
                part = item["content"][0]
                sent_part = sent["content"][0] if sent else {"text": "", "logprobs": []}
                lps = part.get("logprobs")
                chunks += self.out.text(key, part["text"][len(sent_part["text"]):],
                                        lps[len(sent_part.get("logprobs") or []):] if lps else None)
            else:
                chunks += self.out.calls([{"index": int(key.split()[1]),
                                           "function": {"arguments": item["arguments"][len(sent["arguments"]):]}}])
            if item["status"] != "in_progress" and self.out.open.get(key) == index:
                full = item["content"][0].get("logprobs") if key == "message" else None
                chunks += self.out.close_item(key, item["status"], full)
        return chunks

    def end(self, body: dict[str, Any]) -> list[bytes]:
        """The last events: what is left of ``body``'s output, then its end (a cancelled
        stream has no event of its end)."""
        chunks = self.update(body)
        if body["status"] != "cancelled":
            chunks.append(self.out.event(f"response.{body['status']}", response=body))
        return chunks


def replayed_events(stored: dict[str, Any], starting_after: int | None = None) -> list[bytes]:
    """``GET /v1/responses/{id}?stream=true``: a stored response as the events of a stream
    (each item's text or arguments in one delta), those numbered after ``starting_after``."""
    events = SnapshotEvents(stored)
    chunks = [*events.start(), *events.end(stored)]
    return chunks[0 if starting_after is None else starting_after + 1:]
