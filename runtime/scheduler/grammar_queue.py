"""Requests waiting for their grammar to compile (SGLang's grammar queue). Compiles run on
the cache's worker thread; each step the scheduler moves the requests whose grammar is ready
to the waiting queue, each with a matcher of its own, and fails those whose compile failed
or took longer than the timeout. Other requests never wait for a compile.

The timeout counts from the start of a request's own compile, not its arrival: a compile
waiting for the thread behind a slow one is not failed for that one's time. If the compile
under way runs past the timeout, those behind it fail once they have waited a timeout more
(a compile cannot be stopped). A request aborted or failed cancels its compile if it has
not begun and no other request waits for the same grammar."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait

from runtime.constrained.backend import Grammar, GrammarBackend
from runtime.constrained.grammar_cache import GrammarCache
from runtime.constrained.spec import GrammarSpec, spec_of
from runtime.scheduler.req import Req


class GrammarQueue:
    def __init__(self, make_backend: Callable[[], GrammarBackend], timeout_s: float) -> None:
        self._make_backend = make_backend
        self._cache: GrammarCache | None = None
        self.timeout_s = timeout_s
        self.reqs: dict[str, Req] = {}  # by id, in arrival order: taking one out (a 100k batch's) walks nothing
        self._specs: dict[Req, GrammarSpec] = {}
        self._waiters: Counter[Future[Grammar]] = Counter()  # requests here waiting for each compile

    @property
    def cache(self) -> GrammarCache:
        """Built on the first constrained request: the backend indexes the whole vocabulary."""
        if self._cache is None:
            self._cache = GrammarCache(self._make_backend())
        return self._cache

    def __len__(self) -> int:
        return len(self.reqs)

    def needs_grammar(self, req: Req) -> bool:
        return spec_of(req.params) is not None

    def add(self, req: Req) -> None:
        spec = spec_of(req.params)
        assert spec is not None
        self._specs[req] = spec
        req.grammar_future = self.cache.get(spec)
        self._waiters[req.grammar_future] += 1
        self.reqs[req.rid] = req

    def take_ready(self) -> tuple[list[Req], list[Req]]:
        """(requests whose matcher is ready, requests that failed: finished with an error)."""
        ready, failed = [], []
        now = time.perf_counter()
        overdue: dict[int, str | None] = {}  # by compile: the requests sharing one fail together
        for req in list(self.reqs.values()):
            fut = req.grammar_future
            assert fut is not None
            if not fut.done():
                spec = self._specs[req]
                if id(fut) not in overdue:
                    overdue[id(fut)] = self._overdue(spec, fut, now)
                why = overdue[id(fut)]
                if why is not None:
                    self._fail(req, why)  # the last of them cancels the compile if it has not begun
                    self.cache.forget(spec, fut)  # one under way: a retry compiles afresh
                    failed.append(req)
                continue
            try:
                req.grammar = fut.result().matcher()
            except ValueError as err:
                self.cache.forget(self._specs[req], fut)
                self._fail(req, str(err))
                failed.append(req)
                continue
            self._drop(req)
            ready.append(req)
        return ready, failed

    def _overdue(self, spec: GrammarSpec, fut: Future[Grammar], now: float) -> str | None:
        """Why the requests still waiting for ``fut``, the compile of ``spec``, fail now, or None."""
        limit = f"{self.timeout_s:g} s (--grammar-compile-timeout)"
        started = self.cache.started_at(fut)
        if started is not None:
            return f"its {spec.kind} did not compile within {limit}" if now - started > self.timeout_s else None
        busy = self.cache.busy_since()  # waiting for the thread: is the compile ahead stuck?
        if busy is not None and now - busy > 2 * self.timeout_s:
            return f"its {spec.kind} waited to compile behind another grammar that ran past {limit}"
        return None

    def wait(self, timeout_s: float) -> None:
        """Block until a compile finishes (or ``timeout_s``): nothing else can run."""
        futures = [r.grammar_future for r in self.reqs.values() if r.grammar_future is not None]
        if futures:
            wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def remove(self, rid: str) -> Req | None:
        req = self.reqs.get(rid)
        if req is not None:
            self._drop(req)
        return req

    def _fail(self, req: Req, message: str) -> None:
        req.error, req.error_param = message, self._specs[req].kind  # the field that asked for it
        self._drop(req)
        req.finished_reason = {"type": "abort", "message": message}
        req.finished_at = time.perf_counter()

    def _drop(self, req: Req) -> None:
        self.reqs.pop(req.rid, None)
        spec, fut = self._specs.pop(req, None), req.grammar_future
        req.grammar_future = None
        if spec is not None and fut is not None:
            self._waiters[fut] -= 1
            if not self._waiters[fut]:
                del self._waiters[fut]
                self.cache.cancel_unstarted(spec, fut)  # nobody else waits for it: free the compile thread

    def shutdown(self) -> None:
        if self._cache is not None:
            self._cache.shutdown()
