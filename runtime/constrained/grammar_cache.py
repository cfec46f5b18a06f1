"""Compiled grammars, cached by spec in a bounded LRU and compiled on a worker thread so the
scheduler loop never waits for a compile (SGLang's grammar queue keeps the request aside
until its grammar is ready)."""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from runtime.constrained.backend import Grammar, GrammarBackend
from runtime.constrained.spec import GrammarSpec


class _Start:
    """When a compile began (``time.perf_counter``), set by the compile thread; None before."""

    __slots__ = ("__weakref__", "at")

    def __init__(self) -> None:
        self.at: float | None = None


class GrammarCache:
    def __init__(self, backend: GrammarBackend, max_entries: int = 256, threads: int = 1) -> None:
        self.backend = backend
        self.max_entries = max_entries
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="grammar-compile")
        self._entries: OrderedDict[GrammarSpec, Future[Grammar]] = OrderedDict()
        # each compile's start, by its future (kept while the future is: a forgotten compile
        # still running, or a retry of its spec, never reads another's)
        self._starts: weakref.WeakKeyDictionary[Future[Grammar], _Start] = weakref.WeakKeyDictionary()
        self._running: set[_Start] = set()  # the compiles under way
        self.num_compiles = 0
        self.last_compile_s = 0.0

    def get(self, spec: GrammarSpec) -> Future[Grammar]:
        """A future of the compiled grammar: done at once on a hit. A failed compile is not
        kept, so a later request retries it."""
        fut = self._entries.get(spec)
        if fut is not None:
            self._entries.move_to_end(spec)
            return fut
        start = _Start()
        fut = self._pool.submit(self._compile, spec, start)
        self._starts[fut] = start
        self._entries[spec] = fut
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return fut

    def forget(self, spec: GrammarSpec, fut: Future[Grammar] | None = None) -> None:
        """Drop ``spec``'s entry (only where it is ``fut``, if given): a later ``get``
        compiles it afresh."""
        if fut is None or self._entries.get(spec) is fut:
            self._entries.pop(spec, None)

    def cancel_unstarted(self, spec: GrammarSpec, fut: Future[Grammar]) -> None:
        """Cancel and forget ``fut``, the compile of ``spec``, if it still waits for a compile
        thread (no request wants it any more); one under way or done is kept."""
        if fut.cancel():
            self.forget(spec, fut)

    def started_at(self, fut: Future[Grammar]) -> float | None:
        """When the compile ``fut`` began, None while it waits for a compile thread."""
        start = self._starts.get(fut)
        return None if start is None else start.at

    def busy_since(self) -> float | None:
        """When the oldest compile under way began, None when no compile runs."""
        return min((s.at for s in list(self._running) if s.at is not None), default=None)

    def _compile(self, spec: GrammarSpec, start: _Start) -> Grammar:
        start.at = time.perf_counter()
        self._running.add(start)
        try:
            grammar = self.backend.compile(spec)
        finally:
            self._running.discard(start)
        self.last_compile_s = time.perf_counter() - start.at
        self.num_compiles += 1
        return grammar

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
