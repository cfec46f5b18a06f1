"""The HTTP process's messages to the scheduler, in the order they were put, without
holding the event loop for long.

One message is sent at once. A group of many (a ``/generate`` batch of 100k prompts) goes
out as list messages of ``chunk`` requests each (the scheduler handles a list's items in
order), from a task that lets the event loop run between chunks: sent one by one, 100k
requests kept every other client (``/health`` too) waiting ~5 s. Whatever is put while
a group is still going out waits behind it, so an abort never overtakes its request.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from runtime import ipc


class Outbox:
    def __init__(self, sock: zmq.Socket, on_unsent: Callable[[list[Any], Exception], None], chunk: int = 512) -> None:
        """``on_unsent(messages, error)``: some messages could not be sent (the socket closed
        at shutdown): their senders must hear of it, or a request would wait forever."""
        self.sock = sock
        self._on_unsent = on_unsent
        self._chunk = chunk
        self._queue: deque[Any] = deque()
        self._drain: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        """Messages put and not yet sent."""
        return len(self._queue)

    def put(self, msg: Any) -> None:
        self.put_many([msg])

    def put_many(self, msgs: list[Any]) -> None:
        if not msgs:
            return
        if not self._queue and len(msgs) <= self._chunk:
            self._send(msgs)
            return
        self._queue.extend(msgs)
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._send_queued())
            self._drain.add_done_callback(self._drained)  # also if cancelled before it began

    def _drained(self, task: asyncio.Task[None]) -> None:
        self._drain = None
        if self._queue and task.cancelled():  # the loop is closing: what is left is not sent
            msgs = list(self._queue)
            self._queue.clear()
            self._on_unsent(msgs, RuntimeError("the server is shutting down"))

    async def _send_queued(self) -> None:
        while self._queue:
            n = min(self._chunk, len(self._queue))
            self._send([self._queue.popleft() for _ in range(n)])
            await asyncio.sleep(0)

    def _send(self, msgs: list[Any]) -> None:
        try:
            sent = self.sock.send_multipart(ipc.encode(msgs[0] if len(msgs) == 1 else msgs), copy=False)
        except Exception as err:  # noqa: BLE001 - reported to the senders, whatever it is
            self._on_unsent(msgs, err)
            return
        # A zmq.asyncio socket answers with a future, done unless the send had to wait.
        if sent.done():
            self._failed(msgs, sent)
        else:
            sent.add_done_callback(functools.partial(self._failed, msgs))

    def _failed(self, msgs: list[Any], sent: asyncio.Future[Any]) -> None:
        if sent.cancelled():
            self._on_unsent(msgs, RuntimeError("the send was cancelled"))
        elif (err := sent.exception()) is not None:
            self._on_unsent(msgs, err)  # type: ignore[arg-type]
