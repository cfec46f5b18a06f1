"""Where ``/v1/responses`` and ``/v1/conversations`` keep what they store: responses (for
``previous_response_id``, ``GET`` / ``DELETE /v1/responses/{id}`` and their input items) and
conversations (their items, which a response given ``conversation`` continues and extends).

Storage is a table of JSON values by id that keeps the last ``capacity`` used (stored or
read):
- ``MemoryTable``: in this process's memory (the reference, and the default);
- ``SqliteTable``: in a SQLite file (``--response-store``), so that several servers, e.g. the
  replicas of ``--dp-size`` behind the gateway, which may send a continuation to a replica
  other than the one that answered first, share them.
``ResponseStore`` and ``ConversationStore`` give those values their meaning and their errors
(a missing id: a 400 naming the field of a new request that names it, else a 404)."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from runtime.server.protocol import ApiError

RUNNING = ("queued", "in_progress")


class Table(Protocol):
    """JSON values by id, the last ``capacity`` used kept; ``where`` says where, for errors."""

    capacity: int
    where: str

    def put(self, key: str, value: Any) -> None: ...

    def get(self, key: str, touch: bool = True) -> Any:
        """The value (now the most recently used, unless ``touch`` is false), or None."""

    def remove(self, key: str) -> None: ...

    def update(self, key: str, change: Callable[[Any], Any]) -> Any:
        """Replace the value by ``change(value)`` at once (nothing in between), and return it;
        None where there is no value."""


class MemoryTable:
    """The last ``capacity`` values used, by id, in memory (the reference ``Table``)."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self.where = "this server keeps them in memory until it stops"
        self._values: OrderedDict[str, Any] = OrderedDict()

    def put(self, key: str, value: Any) -> None:
        self._values[key] = value
        self._values.move_to_end(key)
        while len(self._values) > self.capacity:
            self._values.popitem(last=False)

    def get(self, key: str, touch: bool = True) -> Any:
        if key not in self._values:
            return None
        if touch:
            self._values.move_to_end(key)
        return self._values[key]

    def remove(self, key: str) -> None:
        self._values.pop(key, None)

    def update(self, key: str, change: Callable[[Any], Any]) -> Any:
        value = self.get(key)
        if value is None:
            return None
        self.put(key, new := change(value))
        return new


class SqliteTable:
    """A ``Table`` in table ``name`` of a SQLite file that every server given ``path`` reads
    and writes (WAL mode; each call one short transaction; recency a counter kept in the file)."""

    def __init__(self, path: str, name: str, capacity: int = 1024) -> None:
        self.capacity, self.where, self.name = capacity, f"they live in {path}", name
        self._db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"CREATE TABLE IF NOT EXISTS {name} (id TEXT PRIMARY KEY, used INTEGER NOT NULL, "
                         "value TEXT NOT NULL)")
        self._db.execute(f"CREATE INDEX IF NOT EXISTS {name}_used ON {name} (used)")

    def close(self) -> None:
        self._db.close()

    def _value(self, key: str) -> Any:
        row = self._db.execute(f"SELECT value FROM {self.name} WHERE id = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def _touch(self, key: str) -> None:
        self._db.execute(f"UPDATE {self.name} SET used = (SELECT COALESCE(MAX(used), 0) + 1 FROM {self.name}) "
                         "WHERE id = ?", (key,))

    def _insert(self, key: str, value: Any) -> None:
        self._db.execute(f"INSERT OR REPLACE INTO {self.name} VALUES (?, 0, ?)", (key, json.dumps(value)))
        self._touch(key)
        self._db.execute(f"DELETE FROM {self.name} WHERE id NOT IN "
                         f"(SELECT id FROM {self.name} ORDER BY used DESC LIMIT ?)", (self.capacity,))

    def put(self, key: str, value: Any) -> None:
        with self._db:  # one transaction: insert, then drop the least recently used beyond capacity
            self._db.execute("BEGIN IMMEDIATE")
            self._insert(key, value)

    def update(self, key: str, change: Callable[[Any], Any]) -> Any:
        with self._db:  # read and write in one transaction: another server's change cannot fall between
            self._db.execute("BEGIN IMMEDIATE")
            value = self._value(key)
            if value is None:
                return None
            self._insert(key, new := change(value))
        return new

    def get(self, key: str, touch: bool = True) -> Any:
        if not touch:  # a plain read: no write lock
            return self._value(key)
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            value = self._value(key)
            if value is not None:
                self._touch(key)
        return value

    def remove(self, key: str) -> None:
        with self._db:
            self._db.execute(f"DELETE FROM {self.name} WHERE id = ?", (key,))


def open_tables(path: str | None, capacity: int = 1024) -> tuple[Table, Table]:
    """The tables of responses and of conversations: in memory, or in the SQLite file ``path``."""
    if path is None:
        return MemoryTable(capacity), MemoryTable(capacity)
    return SqliteTable(path, "responses", capacity), SqliteTable(path, "conversations", capacity)


@dataclass
class StoredResponse:
    """One stored response: the answer, its conversation as chat messages (None while a
    background response runs, or where it failed or was cancelled), its request's input
    items, when it was last written and whether a cancel was asked for. Stored as the JSON
    list ``[response, conversation, input_items, written_at]``, with ``true`` appended once a
    cancel is asked (the layout ``--response-store`` files already hold)."""

    response: dict[str, Any]
    conversation: list[dict[str, Any]] | None
    input_items: list[dict[str, Any]]
    written_at: float
    cancel_asked: bool = False

    @classmethod
    def load(cls, stored: list[Any]) -> StoredResponse:
        return cls(*stored[:4], cancel_asked=bool(stored[4:]))

    def dump(self) -> list[Any]:
        fields = [self.response, self.conversation, self.input_items, self.written_at]
        return [*fields, True] if self.cancel_asked else fields


class ResponseStore:
    """Stored responses (``StoredResponse``). A running (background) response is written
    again by its server every few seconds (``responses_background.py``: ``beat``); one not
    written for ``stale_after`` seconds is read as failed: its server stopped without saying
    so (killed outright), and no reader waits on it for ever. A server sharing the store that
    is asked to cancel a response running elsewhere marks it (``ask_cancel``); the running
    server looks for the mark."""

    def __init__(self, capacity: int = 1024, table: Table | None = None, stale_after: float = 30.0) -> None:
        self.table = table or MemoryTable(capacity)
        self.stale_after = stale_after

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]] | None,
            input_items: list[dict[str, Any]]) -> None:
        self.table.put(response["id"], StoredResponse(response, conversation, input_items, time.time()).dump())

    def beat(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> bool:
        """Write running ``response`` again, at once keeping a cancel mark; whether it has one."""
        asked = False

        def write(stored: list[Any]) -> list[Any]:
            nonlocal asked
            asked = StoredResponse.load(stored).cancel_asked
            return StoredResponse(response, None, input_items, time.time(), asked).dump()

        if self.table.update(response["id"], write) is None:  # dropped from the store meanwhile
            self.put(response, None, input_items)
        return asked

    def ask_cancel(self, response_id: str) -> None:
        """Mark a running response for its server to cancel (nothing if it has ended)."""
        def mark(stored: list[Any]) -> list[Any]:
            record = StoredResponse.load(stored)
            return replace(record, cancel_asked=True).dump() if record.response.get("status") in RUNNING else stored

        self.table.update(response_id, mark)

    def cancel_asked(self, response_id: str) -> bool:
        stored = self.table.get(response_id, touch=False)
        return stored is not None and StoredResponse.load(stored).cancel_asked

    def _seen(self, stored: list[Any]) -> StoredResponse:
        record = StoredResponse.load(stored)
        if record.response.get("status") in RUNNING and time.time() - record.written_at > self.stale_after:
            record.response = {**record.response, "status": "failed", "error": {
                "code": "server_error", "message": "the server running this response stopped before it was finished"}}
        return record

    def _get(self, response_id: str, param: str) -> StoredResponse:
        stored = self.table.get(response_id)
        if stored is None:  # a 400 when the id is a field of a new request, as OpenAI answers
            raise ApiError(400 if param == "previous_response_id" else 404,
                           f"No stored response with id '{response_id}' (the last {self.table.capacity} responses "
                           f"created with store=true are kept; {self.table.where})", param=param)
        return self._seen(stored)

    def response(self, response_id: str) -> dict[str, Any]:
        return self._get(response_id, "response_id").response

    def peek(self, response_id: str) -> dict[str, Any] | None:
        """The response, or None, without counting as a use (for polling)."""
        stored = self.table.get(response_id, touch=False)
        return None if stored is None else self._seen(stored).response

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        record = self._get(response_id, "previous_response_id")
        if record.conversation is None:
            status = record.response["status"]
            ended = "is still in progress" if status in RUNNING else f"ended {status}"
            raise ApiError(400, f"response '{response_id}' {ended}: there is no answer to continue from",
                           param="previous_response_id")
        return record.conversation

    def input_items(self, response_id: str) -> list[dict[str, Any]]:
        return self._get(response_id, "response_id").input_items

    def delete(self, response_id: str) -> None:
        self._get(response_id, "response_id")
        self.table.remove(response_id)


def check_new_ids(items: list[dict[str, Any]], new: list[dict[str, Any]], param: str) -> None:
    """A 400 naming ``param`` where an id of ``new`` is already in ``items`` or twice in ``new``."""
    seen = {i.get("id") for i in items}
    for k, item in enumerate(new):
        if item["id"] in seen:
            raise ApiError(400, f"{param}[{k}]: an item with id '{item['id']}' is already in the conversation",
                           param=param)
        seen.add(item["id"])


@dataclass
class StoredConversation:
    """One conversation: its object (id, created_at, metadata), its items, as the Responses
    API writes items (each with an id), and which response holds it while running, until
    when. Stored as the JSON list ``[conversation, items]``, with ``[holder, until]``
    appended while held."""

    conversation: dict[str, Any]
    items: list[dict[str, Any]]
    holder: str | None = None
    held_until: float = 0.0

    @classmethod
    def load(cls, stored: list[Any]) -> StoredConversation:
        return cls(stored[0], stored[1], *(stored[2] if len(stored) > 2 else ()))

    def dump(self) -> list[Any]:
        fields = [self.conversation, self.items]
        return [*fields, [self.holder, self.held_until]] if self.holder is not None else fields


class ConversationStore:
    """Conversations (``/v1/conversations``, ``StoredConversation``), and the hold a running
    response has on one (``hold``)."""

    def __init__(self, capacity: int = 1024, table: Table | None = None, lease: float = 30.0) -> None:
        self.table = table or MemoryTable(capacity)
        self.lease = lease

    def create(self, items: list[dict[str, Any]], metadata: dict[str, Any] | None) -> dict[str, Any]:
        conversation = {"id": f"conv_{uuid.uuid4().hex}", "object": "conversation", "created_at": int(time.time()),
                        "metadata": metadata or {}}
        self.table.put(conversation["id"], StoredConversation(conversation, items).dump())
        return conversation

    def _missing(self, conversation_id: str, param: str) -> ApiError:
        return ApiError(400 if param == "conversation" else 404,
                        f"No conversation with id '{conversation_id}' (the last {self.table.capacity} used are "
                        f"kept; {self.table.where})", param=param)

    def _get(self, conversation_id: str, param: str) -> StoredConversation:
        stored = self.table.get(conversation_id)
        if stored is None:
            raise self._missing(conversation_id, param)
        return StoredConversation.load(stored)

    def get(self, conversation_id: str) -> dict[str, Any]:
        return self._get(conversation_id, "conversation_id").conversation

    def _change(self, conversation_id: str, change: Callable[[StoredConversation], StoredConversation],
                param: str = "conversation_id") -> StoredConversation:
        """The stored conversation after ``change`` (one atomic update); a missing one is an
        error naming ``param``."""
        stored = self.table.update(conversation_id, lambda s: change(StoredConversation.load(s)).dump())
        if stored is None:
            raise self._missing(conversation_id, param)
        return StoredConversation.load(stored)

    def update(self, conversation_id: str, metadata: dict[str, Any] | None) -> dict[str, Any]:
        def set_metadata(c: StoredConversation) -> StoredConversation:
            return replace(c, conversation={**c.conversation, "metadata": metadata or {}})

        return self._change(conversation_id, set_metadata).conversation

    def delete(self, conversation_id: str) -> None:
        self._get(conversation_id, "conversation_id")
        self.table.remove(conversation_id)

    def items(self, conversation_id: str, param: str = "conversation_id") -> list[dict[str, Any]]:
        return self._get(conversation_id, param).items

    def append(self, conversation_id: str, new: list[dict[str, Any]], param: str = "items") -> None:
        """Add ``new`` at the end, at once; a 400 naming ``param`` if an id would be there twice."""
        def add(c: StoredConversation) -> StoredConversation:
            check_new_ids(c.items, new, param)
            return replace(c, items=[*c.items, *new])

        self._change(conversation_id, add)

    def item(self, conversation_id: str, item_id: str) -> dict[str, Any]:
        found = next((i for i in self.items(conversation_id) if i.get("id") == item_id), None)
        if found is None:
            raise ApiError(404, f"No item with id '{item_id}' in conversation '{conversation_id}'", param="item_id")
        return found

    def remove_item(self, conversation_id: str, item_id: str) -> dict[str, Any]:
        self.item(conversation_id, item_id)  # a 404 where there is none

        def drop(c: StoredConversation) -> StoredConversation:
            return replace(c, items=[i for i in c.items if i.get("id") != item_id])

        return self._change(conversation_id, drop).conversation

    def hold(self, conversation_id: str, owner: str) -> list[dict[str, Any]]:
        """Hold the conversation for response ``owner`` for ``lease`` seconds from now (taken,
        or renewed) and return its items, at once: a 400 ``conversation_locked`` (OpenAI's
        answer) while another response holds it. A hold not renewed lapses: its server
        stopped without releasing it."""
        def take(c: StoredConversation) -> StoredConversation:
            if c.holder not in (None, owner) and c.held_until > time.time():
                raise ApiError(400, f"Another response ({c.holder}) is running on conversation '{conversation_id}'; "
                                    "retry once it has finished", param="conversation", code="conversation_locked")
            return replace(c, holder=owner, held_until=time.time() + self.lease)

        return self._change(conversation_id, take, "conversation").items

    def release(self, conversation_id: str, owner: str) -> None:
        """End ``owner``'s hold, if it still has it (a conversation deleted meanwhile: nothing)."""
        def let_go(stored: list[Any]) -> list[Any]:
            c = StoredConversation.load(stored)
            return replace(c, holder=None, held_until=0.0).dump() if c.holder == owner else stored

        self.table.update(conversation_id, let_go)
