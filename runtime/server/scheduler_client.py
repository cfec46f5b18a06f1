"""The HTTP process's client of the scheduler (it does not tokenize: the handlers do): one
state per request, ZMQ to the scheduler and back from the detokenizer.

A request enters the server in ``submit_many`` (already validated and tokenized by the HTTP
handlers), and its results arrive in ``_receive_loop``; ``wait_all`` and ``merged`` hand them to
the handler and abort the request when its client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from runtime import ipc
from runtime.ipc.messages import (
    AbortReq,
    BatchStrOut,
    ControlOut,
    ControlReq,
    ReadyOut,
    StrUpdate,
    TokenizedGenerateReq,
    split_ids,
)
from runtime.request_options import RequestOptions
from runtime.sampling.params import SamplingParams
from runtime.server.metrics import ServerMetrics
from runtime.server.outbox import Outbox
from runtime.server.request_log import RequestLog


class ServerUnavailable(Exception):
    """The scheduler or detokenizer is gone, or the server is shutting down."""


@dataclass(eq=False)
class ReqState:
    rid: str  # the request's id (the client's own ``rid``, one expanded from it, or one made here)
    prompt_tokens: int
    return_logprob: bool
    first_prompt_token: int
    # the id the scheduler and detokenizer know it by: ``rid`` plus a number this client never
    # gives twice, so a client that aborts a request and sends its rid again at once gets no
    # update meant for the first one
    wire_id: str = ""
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished_reason: dict[str, Any] | None = None
    cached_tokens: int = 0
    error: str | None = None
    error_status: int = 400  # a request the scheduler refused; 500 when a process died
    error_param: str | None = None  # the field the error is about (native name)
    input_token_logprobs: list[Any] = field(default_factory=list)
    input_top_logprobs: list[Any] = field(default_factory=list)
    input_token_ranks: list[int | None] = field(default_factory=list)
    output_token_logprobs: list[Any] = field(default_factory=list)
    output_top_logprobs: list[Any] = field(default_factory=list)
    created_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    on_change: Callable[[], None] | None = None  # besides ``changed``: a group's watcher (``SchedulerClient.merged``)
    client_rid: str | None = None  # the ``rid`` the client gave (``rid`` for ``rid_0``, ``rid_1``, ...)
    log_end: bool = False  # its arrival was logged (--log-requests) and its end is not yet
    stream: bool = False  # its tokens come as they are made (else all at its end)
    probe: bool = False  # the server's own health probe: in no log and no metric

    @property
    def is_finished(self) -> bool:
        return self.finished_reason is not None or self.error is not None

    def apply(self, u: StrUpdate, new_ids: np.ndarray) -> None:
        t = u.token
        self.output_ids.extend(new_ids.tolist())
        self.text = u.text
        self.cached_tokens = t.cached_tokens
        if t.input_token_logprobs is not None:
            self.input_token_logprobs = t.input_token_logprobs
            self.input_top_logprobs = t.input_top_logprobs or []
            self.input_token_ranks = t.input_token_ranks or []
        if t.output_token_logprobs:
            self.output_token_logprobs.extend(t.output_token_logprobs)
            self.output_top_logprobs.extend(t.output_top_logprobs or [])
        if self.error is None:  # an error set here (shutting down, a process died) stays
            self.error, self.error_param = t.error, t.error_param
        self.finished_reason = t.finished_reason
        now = time.perf_counter()
        if len(new_ids):
            self.first_token_at = self.first_token_at or now
            self.last_token_at = now
        if self.is_finished:
            self.finished_at = now
        self.notify()

    def notify(self) -> None:
        """Tell whoever waits on this request that it changed."""
        self.changed.set()
        if self.on_change is not None:
            self.on_change()


class SchedulerClient:
    def __init__(self, to_scheduler: str, from_detokenizer: str, metrics: ServerMetrics) -> None:
        self.ctx = zmq.asyncio.Context()
        self.outbox = Outbox(ipc.connect(self.ctx, zmq.PUSH, to_scheduler), self._unsent)  # every message to the scheduler
        self.recv_sock = ipc.bind(self.ctx, zmq.PULL, from_detokenizer)
        self.metrics = metrics
        self.request_log = RequestLog()  # --log-requests: off until the server configures it
        self.states: dict[str, ReqState] = {}  # open requests by client rid
        self.by_wire_id: dict[str, ReqState] = {}  # the same, by the id the backend knows
        self._wire_ids = itertools.count()
        self.calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self.failure: str | None = None  # set when a backend process died
        self.info: dict[str, Any] = {}

    # ------------------------------------------------------------------ lifecycle
    async def wait_ready(self, timeout: float, alive: Callable[[], str | None]) -> None:
        """Wait for the scheduler's ``ReadyOut``; raise ``RuntimeError`` with the reason if
        the model failed to load, a process died (``alive`` names it) or time ran out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.recv_sock.poll(500):
                msg = await ipc.recv_async(self.recv_sock)
                if isinstance(msg, ReadyOut):
                    if msg.error:
                        raise RuntimeError(f"the model could not be loaded: {msg.error}")
                    self.info = msg.info
                    return
            dead = alive()
            if dead:
                raise RuntimeError(f"the {dead} process exited during startup")
        raise RuntimeError(f"the scheduler was not ready after {timeout:.0f}s")

    def start(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._receive_loop())

    def fail_all(self, reason: str) -> None:
        """A backend process died: every open request ends with an error, none hangs."""
        self.failure = reason
        self.end_open_requests(reason, 500)
        for fut in self.calls.values():
            if not fut.done():
                fut.set_exception(ServerUnavailable(reason))

    def end_open_requests(self, reason: str, status: int) -> None:
        """Answer every open request with this error now (its handler sends it)."""
        for state in self.states.values():
            state.error, state.error_status = reason, status
            state.notify()
            self.request_log.ended(state)

    # ------------------------------------------------------------------ requests
    def new_rid(self) -> str:
        """A fresh request id; random, so that no id a client picks for itself (``rid``) can
        be the one a later request of another client gets."""
        return f"req-{uuid.uuid4().hex}"

    @property
    def num_open_requests(self) -> int:
        return len(self.states)

    def submit(
        self,
        rid: str,
        input_ids: list[int],
        params: SamplingParams,
        options: RequestOptions | None = None,
        log: bool = True,
    ) -> ReqState:
        """Send a request to the scheduler. ``log``: false for the server's own health probes,
        which --log-requests and /metrics leave out."""
        return self.submit_many([(rid, input_ids, params, options or RequestOptions())], log)[0]

    def submit_many(self, requests: list[tuple[str, list[int], SamplingParams, RequestOptions]],
                    log: bool = True) -> list[ReqState]:
        """Send requests (each: its id, prompt, sampling parameters and options) to the
        scheduler, all or none: every id must be free. A large group goes out in chunks
        while the event loop runs (``Outbox``); its states are open at once."""
        if self.failure is not None:
            raise ServerUnavailable(self.failure)
        seen: set[str] = set()
        clashes = [rid for rid, *_ in requests if rid in self.states or rid in seen or seen.add(rid)]
        if clashes:
            raise ValueError(f"request ids must be unique, not already in use: {_first_few(clashes)}")
        states, msgs = [], []
        # The collector would run many times over a heap growing by 100k states (2/3 of
        # the loop's time then, with the event loop held): it runs after, once if at all.
        with _collector_paused(len(requests) > 1000):
            group = None  # the scheduler orders one call's requests fairly against other calls'
            for rid, input_ids, params, options in requests:
                state = ReqState(rid, len(input_ids), options.return_logprob, input_ids[0],
                                 f"{rid}#{next(self._wire_ids)}", stream=options.stream, probe=not log)
                if group is None and len(requests) > 1:
                    group = state.wire_id
                self.states[rid] = self.by_wire_id[state.wire_id] = state
                if log:
                    self.metrics.on_submit(len(input_ids))
                    self.request_log.received(state, input_ids, params)
                states.append(state)
                msgs.append(TokenizedGenerateReq(state.wire_id, np.asarray(input_ids, dtype=np.int32), params, options,
                                                group))
        self.outbox.put_many(msgs)
        return states

    def abort(self, state: ReqState) -> None:
        self.abort_many([state])

    def abort_many(self, states: list[ReqState]) -> None:
        """Abort the open ones of ``states`` (their client went away), in one message per
        chunk (one each held the event loop ~1 s for a 100k-prompt batch)."""
        aborts = []
        for state in states:
            if self._forget(state) and self.failure is None:
                aborts.append(AbortReq(state.wire_id))
                if not state.probe:
                    self.metrics.on_abort()
                self.request_log.ended(state, "aborted: the client went away")
        self.outbox.put_many(aborts)

    def _forget(self, state: ReqState) -> bool:
        """Stop routing updates to ``state``; whether it was open."""
        if self.by_wire_id.pop(state.wire_id, None) is None:
            return False
        del self.states[state.rid]
        return True

    def cancel(self, state: ReqState, message: str) -> None:
        self.cancel_many([state], message)

    def cancel_many(self, states: list[ReqState], message: str) -> None:
        """Abort ``states`` for a reason other than their client leaving. The scheduler ends
        each at its next step and answers as for any finish: the output so far (all of it,
        for a request that does not stream) with an ``abort`` finish reason saying
        ``message``, as SGLang answers. One that already finished keeps its own answer."""
        if self.failure is None:
            self.outbox.put_many([AbortReq(s.wire_id, message) for s in states
                                  if not s.is_finished and s.wire_id in self.by_wire_id])

    def _unsent(self, msgs: list[Any], err: Exception) -> None:
        """The outbox could not send ``msgs``: their requests end with a 500 and their calls
        fail, rather than wait for an answer that cannot come."""
        reason = f"the request could not be sent to the scheduler: {err}"
        for msg in msgs:
            if isinstance(msg, TokenizedGenerateReq) and (state := self.by_wire_id.get(msg.rid)) is not None:
                state.error, state.error_status = reason, 500
                self._forget(state)
                self.request_log.ended(state)
                state.notify()
            elif isinstance(msg, ControlReq) and (fut := self.calls.get(msg.call_id)) is not None and not fut.done():
                fut.set_exception(ServerUnavailable(reason))

    async def wait(self, state: ReqState, is_disconnected: Callable[[], Awaitable[bool]] | None = None) -> ReqState:
        """``wait_all`` for one request."""
        await self.wait_all([state], is_disconnected)
        return state

    async def wait_all(self, states: list[ReqState], is_disconnected: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Wait until each of ``states`` has finished, as ``merged`` watches them: one loop for
        the group (a loop per request, each waking every second, kept the HTTP process busy
        through a /generate batch of 20k prompts); the client gone, or the wait cancelled, the
        unfinished ones are aborted."""
        async with contextlib.aclosing(self.merged(states, is_disconnected)) as changes:
            async for _ in changes:
                pass

    async def merged(
        self, states: list[ReqState], is_disconnected: Callable[[], Awaitable[bool]] | None = None
    ) -> AsyncIterator[int]:
        """The index of one of ``states`` each time it changed (once for changes since it was
        last given), until all have finished; closing the iterator early, or the client gone
        (``is_disconnected``, looked at once a second, also while requests keep finishing),
        aborts the unfinished ones. One loop for the group, however many requests it has."""
        changed: dict[int, None] = {}  # the indexes to give, in the order they changed
        woken = asyncio.Event()

        def mark(i: int) -> None:
            changed[i] = None
            woken.set()

        for i, state in enumerate(states):
            state.on_change = functools.partial(mark, i)
            if state.changed.is_set():
                mark(i)
        unfinished = len(states)
        loop = asyncio.get_running_loop()
        look_at = loop.time() + _DISCONNECT_CHECK_S
        try:
            while unfinished:
                # on a clock, not on a quiet second: a batch finishing a request every step
                # has none, and ran to its end for a client long gone
                if loop.time() >= look_at:
                    if is_disconnected is not None and await is_disconnected():
                        return
                    look_at = loop.time() + _DISCONNECT_CHECK_S
                if not changed:
                    woken.clear()
                    await _wait_event(woken, max(look_at - loop.time(), 0.0))
                    continue
                i = next(iter(changed))
                del changed[i]
                states[i].changed.clear()
                finished = states[i].is_finished  # as the consumer sees it: its last update may
                yield i  # come while the consumer has it, to be given again
                if finished:
                    states[i].on_change = None
                    unfinished -= 1
        finally:
            for state in states:
                state.on_change = None
            self.abort_many([state for state in states if not state.is_finished])

    async def call(self, kind: str, arg: Any = None, timeout: float = 30.0) -> Any:
        """A request/response call into the scheduler: ``kind`` is ``stats``, ``flush_cache``,
        ``end_program`` (``arg``: the program id) or ``log_level`` (``arg``: the level); see
        ``ControlReq``."""
        if self.failure is not None:
            raise ServerUnavailable(self.failure)
        call_id = next(self._call_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls[call_id] = fut
        try:
            self.outbox.put(ControlReq(call_id, kind, arg))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.calls.pop(call_id, None)

    # ------------------------------------------------------------------ results
    async def _receive_loop(self) -> None:
        while True:
            msg = await ipc.recv_async(self.recv_sock)
            if isinstance(msg, BatchStrOut):
                for u, new_ids in zip(msg.updates, split_ids(msg.ids, msg.updates), strict=True):
                    state = self.by_wire_id.get(u.token.rid)
                    if state is None:  # aborted by us; the scheduler's last word on it
                        self.metrics.generation_tokens += len(new_ids)  # made all the same
                        continue
                    first = state.first_token_at is None
                    last_at = state.last_token_at
                    state.apply(u, new_ids)
                    if not state.probe:
                        self.metrics.on_tokens(state, len(new_ids), first, last_at)
                    if state.is_finished:
                        self._forget(state)
                        if not state.probe:
                            self.metrics.on_finish(state)
                        self.request_log.ended(state)
            elif isinstance(msg, ControlOut):
                fut = self.calls.get(msg.call_id)
                if fut is not None and not fut.done():
                    fut.set_result(msg.result)


def _first_few(items: list[str], most: int = 10) -> str:
    """The first ``most`` of ``items`` for an error message, and how many more there are
    (a 100k-prompt batch's ids are no message)."""
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(map(repr, items[:most])) + more


@contextlib.contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """Python's cyclic garbage collector off inside (if ``pause``, and it was on)."""
    was_on = pause and gc.isenabled()
    if was_on:
        gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


# How often a group's wait looks whether its client is still there.
_DISCONNECT_CHECK_S = 1.0


async def _wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Whether ``event`` was set within ``timeout`` seconds. ``asyncio.timeout`` (3.11+) costs
    a third less than ``wait_for``, which wraps the wait in a task: this runs once per
    streamed update."""
    if sys.version_info < (3, 11):
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
        return True
    except TimeoutError:
        return False
