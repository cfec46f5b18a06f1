"""How ``Engine.generate``'s calls are handed back: a stream that aborts its requests when
closed early, and the pieces ``async_generate`` uses to run a call on a worker thread and
abort its requests when its task is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

from runtime.scheduler.req import Req


class AbortsRequests(Protocol):
    def abort_unfinished(self, reqs: list[Req]) -> None: ...


class RequestStream(Iterator[dict[str, Any]]):
    """What ``Engine.generate(stream=True)`` returns: its outputs, one at a time. Closing it
    (or dropping it) before its end aborts its requests, also before the first output, where
    a bare generator would skip its cleanup and leave them for later calls to compute."""

    def __init__(self, engine: AbortsRequests, reqs: list[Req], outputs: Iterator[dict[str, Any]]) -> None:
        self._engine, self._reqs, self._outputs = engine, reqs, outputs

    def __next__(self) -> dict[str, Any]:
        return next(self._outputs)

    def close(self) -> None:
        self._engine.abort_unfinished(self._reqs)  # first: another thread may be reading it
        with contextlib.suppress(ValueError):  # "generator already executing" (that thread's)
            self._outputs.close()  # type: ignore[attr-defined]  # a generator

    def __enter__(self) -> RequestStream:
        """``with engine.generate(..., stream=True) as stream:``: leaving the block any way
        (Ctrl-C in the loop's body too) aborts what is unfinished; without it that waits
        until the stream is dropped, which a traceback kept for debugging delays."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the engine may be gone
            self.close()


class CancellableCall:
    """A non-streamed ``async_generate`` running on a worker thread: when its task is
    cancelled, its requests are aborted, whether or not they were queued yet."""

    def __init__(self, engine: AbortsRequests) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._reqs: list[Req] = []
        self._cancelled = False

    def queued(self, reqs: list[Req]) -> None:
        with self._lock:
            self._reqs = reqs
            cancelled = self._cancelled
        if cancelled:  # cancelled while they were being queued
            self._engine.abort_unfinished(reqs)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            reqs = self._reqs
        self._engine.abort_unfinished(reqs)


def on_own_thread(fn: Callable[[], None]) -> asyncio.Future[None]:
    """``fn()`` on a new thread; the future is done when it returns."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def run() -> None:
        try:
            fn()
        finally:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

    threading.Thread(target=run, daemon=True, name="forkserve-abort").start()
    return done


async def async_outputs(stream: RequestStream) -> AsyncIterator[dict[str, Any]]:
    """A stream's outputs for asyncio, each read on a worker thread."""
    done = object()
    try:
        while (chunk := await asyncio.to_thread(next, stream, done)) is not done:
            yield chunk  # type: ignore[misc]
    finally:
        stream.close()
