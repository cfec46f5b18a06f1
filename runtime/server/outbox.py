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
from collections import deque
from typing import Any

import zmq

from runtime import ipc


class Outbox:
    def __init__(self, sock: zmq.Socket, chunk: int = 512) -> None:
        self.sock = sock
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
        if not self._queue and len(msgs) <= self._chunk:
            self._send(msgs)
            return
        self._queue.extend(msgs)
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._send_queued())

    async def _send_queued(self) -> None:
        try:
            while self._queue:
                n = min(self._chunk, len(self._queue))
                self._send([self._queue.popleft() for _ in range(n)])
                await asyncio.sleep(0)
        finally:
            self._drain = None

    def _send(self, msgs: list[Any]) -> None:
        self.sock.send_multipart(ipc.encode(msgs[0] if len(msgs) == 1 else msgs), copy=False)
