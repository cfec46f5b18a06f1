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
            self._entries.popitem(last=False)
        return fut

    def forget(self, spec: GrammarSpec) -> None:
        self._entries.pop(spec, None)

    def _compile(self, spec: GrammarSpec) -> Grammar:
        start = time.perf_counter()
        grammar = self.backend.compile(spec)
        self.last_compile_s = time.perf_counter() - start
        self.num_compiles += 1
        return grammar

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
