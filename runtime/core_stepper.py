"""Who steps the offline engine's core, and when: ``runtime.Engine``'s callers on many
threads, one stepping thread.

Callers queue requests in an inbox (``queue``, never waiting for a step) and wait for news
(``wait_for_news``); one thread (``_step_while_busy``, started on first use) hands the inbox
to the core and steps it while any caller's request is queued or running, so the requests
of overlapping calls share batches. One thread steps, whoever queued: each thread that calls
into torch has its own OpenMP team, and several teams spin on the same cores. Callers read
their requests only between steps (a request a step is finishing still has its KV slots to
free), and calls that need the core itself (``core_access``) go before the next step.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, KeysView

from runtime.scheduler.core import EngineCore
from runtime.scheduler.req import Req

# each request of a call: (output length, finished), read between two steps
Progress = list[tuple[int, bool]]


class CoreStepper:
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.lock = threading.RLock()  # held while the core is touched
        self._inbox: list[Req] = []
        self._live: dict[str, Req] = {}  # the callers' requests by id, until seen finished
        self._inbox_lock = threading.RLock()  # reentrant: its owner is known (``abort``)
        self._deferred_aborts: deque[Req] = deque()  # aborts asked for where they could not wait (``abort``)
        self._turn = threading.Condition()  # news for callers, work for the stepping thread
        self._thread: threading.Thread | None = None  # steps the core (``_step_while_busy``)
        self._callers_waiting = 0  # for the core between steps (``core_access``)
        self._gave_way = False  # a caller had the core since the last step
        self._stepping = False  # a step is in progress (requests are read only between steps)
        self._steps_done = 0
        self._listeners = 0  # callers waiting for news (``wait_for_news``)
        self._looks_due = 0  # of those waiting when the last step ended, how many have not looked
        self.closed = False
        self.failed: BaseException | None = None  # a step raised: the core's state is unknown
        _STEPPERS.add(self)

    @property
    def has_work(self) -> bool:
        """Requests are queued or running (a caller's not yet handed to the core too)."""
        return bool(self._inbox) or self.core.has_work

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this Engine has been shut down; create a new one")
        if self.failed is not None:
            raise RuntimeError(f"the engine failed earlier: {self.failed}")

    def queue(self, reqs: list[Req], ids_for: Callable[[KeysView[str]], list[str]]) -> None:
        """Name ``reqs`` by ``ids_for(the ids in use)`` (which raises ``ValueError`` for ids it
        cannot give) and put them in the inbox."""
        with self._inbox_lock:
            self._live = {r.rid: r for r in self._live.values() if not r.is_finished}
            for req, req_id in zip(reqs, ids_for(self._live.keys()), strict=True):
                req.rid = req_id
            self._inbox += reqs  # first: an interrupt between these lines leaves none unqueued
            self._live.update((req.rid, req) for req in reqs)
        with self._turn:
            self._turn.notify_all()

    def take_inbox(self) -> None:
        """Hand the queued requests to the core (``lock`` held); one that can never run here
        ends at once with the reason as its error."""
        with self._inbox_lock:
            reqs, self._inbox = self._inbox, []
        for req in reqs:
            if req.is_finished:  # aborted while queued
                continue
            try:
                self.core.add_request(req)
            except Exception as err:  # noqa: BLE001 - the request ends with the reason; the rest go on
                req.error = str(err)  # before it reads as finished
                self.core.reject(req, ValueError(err))

    @contextlib.contextmanager
    def core_access(self) -> Iterator[None]:
        """The core to a caller (``lock``), as soon as the step in progress ends: the stepping
        thread lets callers that wait for it go first."""
        with self._turn:
            self._callers_waiting += 1
        try:
            with self.lock:
                yield
        finally:
            with self._turn:
                self._callers_waiting -= 1
                self._gave_way = True  # one caller's turn between two steps: more wait for the lock
                self._turn.notify_all()

    def abort(self, reqs: list[Req]) -> None:
        """Drop those of ``reqs`` still queued or running (their computed KV stays cached).
        Waits for the step in progress, with Ctrl-C held until done (a second Ctrl-C left the
        requests running). Where it would change the core under a step (a dropped stream
        finalized by the garbage collector on the stepping thread) or wait for a lock its own
        thread holds (finalized while its thread queues or waits for news), the stepping
        thread does it after its step. Inside ``between_steps`` it is done at once."""
        if all(req.is_finished for req in reqs):  # nothing to do: no need to wait for the step in progress
            return
        on_stepping_thread = threading.current_thread() is self._thread
        if (self.lock._is_owned() and on_stepping_thread  # type: ignore[attr-defined]
                or self._turn._is_owned() or self._inbox_lock._is_owned()):  # type: ignore[attr-defined]
            self._deferred_aborts.extend(reqs)  # a deque: thread-safe without a lock
            return
        with _ctrl_c_held(), self.core_access():
            if self.closed or self.failed is not None:
                return
            self.take_inbox()
            self._abort_now(reqs)

    def _abort_now(self, reqs: list[Req]) -> None:
        for req in reqs:
            if not req.is_finished:
                self.core.abort(req.rid)
            if not req.is_finished:  # the core never had it (interrupted while being queued)
                req.finished_reason = {"type": "abort", "message": "aborted"}

    def _abort_deferred(self) -> None:
        """The aborts ``abort`` left to the stepping thread (``lock`` held)."""
        while self._deferred_aborts:
            self._abort_now([self._deferred_aborts.popleft()])

    def shutdown(self) -> None:
        """End the core (it checks that no KV slot leaked) and the stepping thread; calls
        after it raise."""
        with self.core_access():
            if self.closed:
                return
            self.closed = True
            self.core.shutdown()
        with self._turn:  # the stepping thread ends, waiting callers raise
            self._turn.notify_all()
        # Waited for: else the thread, ending, could drop the last reference to the core and
        # free the model there, in C++ code, while the interpreter exits (which aborts it).
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)

    def wait_for_news(self, reqs: list[Req], seen: Progress | None) -> Progress:
        """``reqs``' progress (output length, finished) between two steps, once it differs from
        ``seen`` (None: at once), starting the stepping thread if it is not running. Taken
        between steps: a request a step is finishing still has its bookkeeping to do (its
        KV slots freed, its prefix cached). Every caller waiting when a step ends looks before
        the next one starts (else a stream would see its tokens only when the stepping thread
        ran out of work). Raises if the engine failed or was shut down."""
        def progress() -> Progress:
            return [(len(r.output_ids), r.is_finished) for r in reqs]

        if self.lock._is_owned():  # type: ignore[attr-defined]
            raise RuntimeError("an engine call waited for a step inside between_steps(), which holds the steps back")
        with self._turn:
            if (self._thread is None or not self._thread.is_alive()) and self.failed is None and not self.closed:
                self._thread = threading.Thread(target=self._step_while_busy, daemon=True, name=_THREAD_NAME)
                self._thread.start()
            looked_at = self._steps_done
            self._listeners += 1
            try:
                while True:
                    if self._steps_done != looked_at:  # a step ended since: this caller has looked
                        looked_at = self._steps_done
                        self._looks_due -= 1
                        self._turn.notify_all()
                    if not self._stepping and progress() != seen:
                        return progress()
                    if self.closed or self.failed is not None:
                        self.check_open()
                    self._turn.wait()
            finally:
                self._listeners -= 1
                if self._steps_done != looked_at:  # left without looking (an error, Ctrl-C)
                    self._looks_due -= 1
                    self._turn.notify_all()

    def _step_while_busy(self) -> None:
        """The stepping thread: step while any caller's requests are queued or running, then
        wait for more."""
        while True:
            with self._turn:  # only callers' requests (code that adds to the core itself steps it);
                # callers go first: those waiting for the core, until one has had it since the
                # last step (else the stepping thread would take the lock straight back), and
                # those still to look at the last step
                while (not self._inbox and all(r.is_finished for r in list(self._live.values())) or
                       self._callers_waiting and not self._gave_way or self._looks_due > 0) and not self.closed \
                        and not _EXITING.is_set():
                    self._turn.wait()
                if _EXITING.is_set():  # the interpreter is ending: no step may be cut off in torch's code
                    return
                self._stepping = True
            try:
                with self.lock:
                    if self.closed:
                        return
                    self.take_inbox()
                    self._abort_deferred()
                    if self.core.has_work:
                        self.core.step()
                    self._abort_deferred()  # those the garbage collector asked for during the step
            except BaseException as err:  # every caller is told, now and later
                self.failed = err
                return
            finally:
                with self._turn:
                    self._gave_way = False
                    self._stepping = False
                    self._steps_done += 1
                    self._looks_due = self._listeners
                    self._turn.notify_all()


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """A Ctrl-C that arrives inside the block is raised when it ends (on the main thread,
    under Python's own handler; elsewhere nothing changes): work that must finish once
    begun, such as an abort after the first Ctrl-C."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


_EXITING = threading.Event()
_STEPPERS: weakref.WeakSet[CoreStepper] = weakref.WeakSet()
_THREAD_NAME = "forkserve-engine-steps"


@atexit.register
def _stop_stepping_at_exit() -> None:
    """Let each stepping thread end before the interpreter does: a daemon thread stopped
    inside C++ code (a step, or freeing an engine whose last reference it held) aborts the
    process ("terminate called without an active exception"). Threads are found by name:
    one whose stepper is already gone may still be freeing it."""
    _EXITING.set()
    for stepper in list(_STEPPERS):
        with stepper._turn:
            stepper._turn.notify_all()
    for thread in threading.enumerate():
        if thread.name == _THREAD_NAME and thread is not threading.current_thread():
            thread.join(timeout=60)
