"""Where ``/v1/responses`` keeps the responses it stores (``store: true``, the default): for
``previous_response_id``, ``GET`` and ``DELETE /v1/responses/{id}`` and its input items.

- ``ResponseStore``: in this process's memory (the reference, and the default);
- ``SqliteResponseStore``: in a SQLite file (``--response-store``), so that several servers,
  e.g. the replicas of ``--dp-size`` behind the gateway, which may send a continuation to a
  replica other than the one that answered first, share them.

Both keep the last ``capacity`` responses used (stored or read), and answer a missing id the
same way: a 400 naming ``previous_response_id`` in a new request, else a 404."""

from __future__ import annotations

import json
import sqlite3
from collections import OrderedDict
from typing import Any

from runtime.server.protocol import ApiError

# A stored response: the answer, its conversation as chat messages (None while a background
# response runs, or where it failed or was cancelled), its request's input items.
Stored = tuple[dict[str, Any], list[dict[str, Any]] | None, list[dict[str, Any]]]
RUNNING = ("queued", "in_progress")


class ResponseStore:
    """The last ``capacity`` stored responses by id, in memory only."""

    where = "this server keeps them in memory until it stops"

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()

    # ---------------------------------------------------------------- storage (overridden)
    def _write(self, response_id: str, stored: Stored) -> None:
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def _read(self, response_id: str) -> Stored | None:
        """The stored response (now the most recently used), or None."""
        if response_id not in self._items:
            return None
        self._items.move_to_end(response_id)
        return self._items[response_id]

    def _remove(self, response_id: str) -> None:
        del self._items[response_id]

    # ---------------------------------------------------------------- the interface
    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]] | None,
            input_items: list[dict[str, Any]]) -> None:
        self._write(response["id"], (response, conversation, input_items))

    def _get(self, response_id: str, param: str) -> Stored:
        stored = self._read(response_id)
        if stored is None:  # a 400 when the id is a field of a new request, as OpenAI answers
            raise ApiError(400 if param == "previous_response_id" else 404,
                           f"No stored response with id '{response_id}' (the last {self.capacity} responses "
                           f"created with store=true are kept; {self.where})", param=param)
        return stored

    def response(self, response_id: str) -> dict[str, Any]:
        return self._get(response_id, "response_id")[0]

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        response, conversation, _ = self._get(response_id, "previous_response_id")
        if conversation is None:
            ended = "is still in progress" if response["status"] in RUNNING else f"ended {response['status']}"
            raise ApiError(400, f"response '{response_id}' {ended}: there is no answer to continue from",
                           param="previous_response_id")
        return conversation

    def input_items(self, response_id: str) -> list[dict[str, Any]]:
        return self._get(response_id, "response_id")[2]

    def delete(self, response_id: str) -> None:
        self._get(response_id, "response_id")
        self._remove(response_id)


class SqliteResponseStore(ResponseStore):
    """The same in a SQLite file that every server given ``path`` reads and writes (WAL mode;
    each call is one short transaction). Recency is a counter shared through the file."""

    def __init__(self, path: str, capacity: int = 1024) -> None:
        super().__init__(capacity)
        self.where = f"they live in {path}"
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, used INTEGER NOT NULL, "
                         "stored TEXT NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS responses_used ON responses (used)")

    def close(self) -> None:
        self._db.close()

    def _touch(self, response_id: str) -> None:
        self._db.execute("UPDATE responses SET used = (SELECT COALESCE(MAX(used), 0) + 1 FROM responses) WHERE id = ?",
                         (response_id,))

    def _write(self, response_id: str, stored: Stored) -> None:
        with self._db:  # one transaction: insert, then drop the least recently used beyond capacity
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, 0, ?)", (response_id, json.dumps(stored)))
            self._touch(response_id)
            self._db.execute("DELETE FROM responses WHERE id NOT IN "
                             "(SELECT id FROM responses ORDER BY used DESC LIMIT ?)", (self.capacity,))

    def _read(self, response_id: str) -> Stored | None:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT stored FROM responses WHERE id = ?", (response_id,)).fetchone()
            if row is not None:
                self._touch(response_id)
        if row is None:
            return None
        response, conversation, input_items = json.loads(row[0])
        return response, conversation, input_items

    def _remove(self, response_id: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
