"""The one thread that steps a ``runtime.Engine``'s core for every DSL backend on it.

The engine is not thread-safe and its core steps whatever requests it holds, whoever added
them, so an engine has exactly one driver (``EngineDriver.attach``), however many
``EngineBackend``s share it. Callers queue work in its inbox; between steps the driver adds
their requests, runs their functions, and hands each caller its outputs. The driver stops
when the last backend detaches.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from frontend_lang.backend.base import BackendError
from runtime.scheduler.core import RequestOutput
from runtime.scheduler.req import Req


class EngineCall:
    """Requests of one caller, and how the driver reports back."""

    def __init__(self, reqs: list[Req], updates: queue.Queue[Any] | None = None) -> None:
        self.reqs = reqs
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.updates = updates  # streaming: a snapshot of output ids after each step, then None


class EngineDriver:
    _ATTACH_LOCK = threading.Lock()  # guards every engine's driver slot and user counts

    @classmethod
    def attach(cls, engine: Any) -> EngineDriver:
        """The engine's driver (started on first use); ``detach`` once per ``attach``. A
        driver that is stopping finishes first: two must never step one engine. After an
        engine failure, ``BackendError``."""
        while True:
            with cls._ATTACH_LOCK:
                driver: EngineDriver | None = getattr(engine, "_dsl_driver", None)
                if driver is not None and driver._broken is not None:
                    raise BackendError(f"the engine failed earlier: {driver._broken}")
                if driver is None or not driver._thread.is_alive():
                    driver = engine._dsl_driver = cls(engine)
                if not driver._stopping:
                    driver._users += 1
                    return driver
            driver._thread.join()

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._users = 0
        self._stopping = False
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._calls: dict[Req, EngineCall] = {}
        self._broken: BaseException | None = None
        # Guards the inbox once the driver has stopped: what is sent after that is refused
        # at once, and what was queued before it is answered by the driver on its way out.
        self._gate = threading.Lock()
        self.closed: BaseException | None = None
        self._thread = threading.Thread(target=self._drive, daemon=True, name="forkserve-engine-driver")
        self._thread.start()

    def detach(self) -> None:
        """One user fewer; the last one stops the driver."""
        with EngineDriver._ATTACH_LOCK:
            self._users -= 1
            last = self._users == 0
        if last:
            self.stop()

    def stop(self) -> None:
        """Stop now, whoever else uses it (the engine is going away): what is queued or in
        flight is answered with an error and its requests leave the engine."""
        with EngineDriver._ATTACH_LOCK:
            first = not self._stopping
            self._stopping = True
        if first:
            self._inbox.put(None)
        self._thread.join(30)

    # ------------------------------------------------------------------ callers
    def send(self, item: EngineCall | tuple[Callable[[], Any], Future[Any]]) -> None:
        """Queue ``item`` for the driver; ``BackendError`` once the driver has stopped."""
        with self._gate:
            if self.closed is not None:
                raise BackendError(str(self.closed))
            self._inbox.put(item)

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the driver thread, between steps."""
        fut: Future[Any] = Future()
        self.send((fn, fut))
        return fut.result()

    # ------------------------------------------------------------------ the thread
    def _drive(self) -> None:
        try:
            self._drive_until_stopped()
        except BaseException as err:  # a bug in the driver itself: callers are told what it was
            self._broken = self._broken or err
            raise
        finally:  # nothing queued or sent later waits for ever
            with self._gate:
                self.closed = (BackendError(f"the engine failed earlier: {self._broken}") if self._broken is not None
                               else BackendError("the engine backend was shut down"))
            while True:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, tuple):
                    item[1].set_exception(self.closed)
                elif item is not None:
                    self._finish(item, self.closed)
            if self._broken is None:  # a later driver must not step requests no one reads
                for req in self._calls:
                    if not req.is_finished:
                        self.engine.core.abort(req.rid, "the engine backend was shut down")
            self._fail_all(self.closed)

    def _drive_until_stopped(self) -> None:
        """Take callers' work between steps, step, hand each caller its outputs."""
        core = self.engine.core
        while True:
            items = [self._inbox.get()] if not core.has_work else []
            while True:
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for k, item in enumerate(items):
                if item is None:
                    for rest in items[k + 1 :]:  # answered on the way out (``_drive``)
                        self._inbox.put(rest)
                    return
                self._accept(item)
            if not core.has_work:
                continue
            try:
                outputs = core.step()
            except Exception as err:  # the engine is in an unknown state: fail everyone
                self._broken = err
                self._fail_all(err)
                return
            self._report(outputs)

    def _accept(self, item: EngineCall | tuple[Callable[[], Any], Future[Any]]) -> None:
        if isinstance(item, tuple):
            fn, fut = item
            try:
                fut.set_result(fn())
            except Exception as err:
                fut.set_exception(err)
            return
        try:
            for req in item.reqs:
                self.engine.core.add_request(req)
        except ValueError as err:  # added ones run to the end unobserved
            self._finish(item, err)
            return
        for req in item.reqs:
            self._calls[req] = item

    def _report(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            req = out.req
            call = self._calls.get(req)
            if call is None:
                continue
            if call.updates is not None and not req.is_finished:
                call.updates.put(list(req.output_ids))
            if req.is_finished:
                del self._calls[req]
                if all(r.is_finished for r in call.reqs):
                    failed = next((r.error for r in call.reqs if r.error is not None), None)
                    self._finish(call, ValueError(failed) if failed else None)

    def _fail_all(self, error: BaseException) -> None:
        for call in set(self._calls.values()):
            self._finish(call, error)
        self._calls.clear()

    @staticmethod
    def _finish(call: EngineCall, error: BaseException | None) -> None:
        call.error = error
        if call.updates is not None:
            call.updates.put(None)
        call.done.set()
