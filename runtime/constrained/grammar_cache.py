"""Compiled grammars, cached by spec in a bounded LRU and compiled on a worker thread so the
scheduler loop never waits for a compile (SGLang's grammar queue keeps the request aside
until its grammar is ready)."""

from __future__ import annotations

import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from runtime.constrained.backend import Grammar, GrammarBackend
from runtime.constrained.spec import GrammarSpec


class GrammarCache:
    def __init__(self, backend: GrammarBackend, max_entries: int = 256, threads: int = 1) -> None:
        self.backend = backend
        self.max_entries = max_entries
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="grammar-compile")
        self._entries: OrderedDict[GrammarSpec, Future[Grammar]] = OrderedDict()
        self._started: dict[GrammarSpec, float] = {}  # when each spec's compile began
        self._running: dict[GrammarSpec, float] = {}  # the compiles under way, since when
        self.num_compiles = 0
        self.last_compile_s = 0.0

    def get(self, spec: GrammarSpec) -> Future[Grammar]:
        """A future of the compiled grammar: done at once on a hit. A failed compile is not
        kept, so a later request retries it."""
        fut = self._entries.get(spec)
        if fut is not None:
            self._entries.move_to_end(spec)
            return fut
        fut = self._pool.submit(self._compile, spec)
        self._entries[spec] = fut
        while len(self._entries) > self.max_entries:
            self._started.pop(self._entries.popitem(last=False)[0], None)
        return fut

    def forget(self, spec: GrammarSpec) -> None:
        """Drop ``spec``'s entry (a later ``get`` compiles it afresh)."""
        self._entries.pop(spec, None)
        self._started.pop(spec, None)

    def cancel_unstarted(self, spec: GrammarSpec) -> None:
        """Cancel and forget the compile of ``spec`` if it still waits for a compile thread
        (no request wants it any more); one under way or done is kept."""
        fut = self._entries.get(spec)
        if fut is not None and fut.cancel():
            self.forget(spec)

    def started_at(self, spec: GrammarSpec) -> float | None:
        """When the compile of ``spec`` began (``time.perf_counter``), None while it waits
        for a compile thread."""
        return self._started.get(spec)

    def busy_since(self) -> float | None:
        """When the oldest compile under way began, None when no compile runs."""
        return min(self._running.values(), default=None)

    def _compile(self, spec: GrammarSpec) -> Grammar:
        start = time.perf_counter()
        self._started[spec] = self._running[spec] = start
        try:
            grammar = self.backend.compile(spec)
        finally:
            self._running.pop(spec, None)
        self.last_compile_s = time.perf_counter() - start
        self.num_compiles += 1
        return grammar

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
