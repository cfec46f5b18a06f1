"""Run a workload's programs against a backend and collect what happened.

Two ways to send load:
  - concurrency ``C``: ``C`` programs in flight at any time, the next starting as one ends;
  - request rate ``R`` (programs/s): programs arrive as a Poisson process (seeded), each
    starting on arrival (capped at ``C`` in flight if both are given); a program's
    latency then counts from its arrival, so queueing shows.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from bench_agent.drivers import KVProbe, KVReading
from bench_agent.recording import CallLog, CallRecord, RecordingBackend
from bench_agent.workloads import Workload
from frontend_lang.backend.base import Backend
from frontend_lang.program import ProgramBatch


@dataclass
class RunResult:
    records: list[CallRecord]
    program_latencies: list[float]
    wall_s: float
    num_programs: int
    errors: list[str] = field(default_factory=list)
    peak_kv_usage: float | None = None
    # each program's final state (its messages and variables), by index; None where it failed
    states: list[Any] = field(default_factory=list)


class _PeakSampler:
    """Polls a KV probe in the background and keeps the highest reading. Where the server
    keeps its own high-water mark, a rise of that mark during the run counts too: polling
    alone misses a run shorter than its interval."""

    def __init__(self, probe: KVProbe | None, interval: float = 0.25) -> None:
        self.probe, self.interval, self.peak = probe, interval, None
        self._first: KVReading | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> KVReading | None:
        try:
            reading = self.probe() if self.probe else None
        except Exception:  # a probe failing mid-run loses a sample, not the run
            return None
        if reading is not None:
            self._fold(reading.now)
        return reading

    def _fold(self, value: float) -> None:
        self.peak = value if self.peak is None else max(self.peak, value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._read()

    def __enter__(self) -> _PeakSampler:
        if self.probe is not None:
            self._first = self._read()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
            last = self._read()
            first = self._first
            # The mark only rises between flushes, so a rise happened in this run.
            if first is not None and first.peak is not None and last is not None and last.peak is not None \
                    and last.peak > first.peak:
                self._fold(last.peak)


def run_workload(
    workload: Workload,
    backend: Backend,
    program_args: list[dict[str, Any]],
    *,
    concurrency: int | None = 8,
    request_rate: float | None = None,
    seed: int = 0,
    kv_probe: KVProbe | None = None,
    progress: bool = True,
    desc: str = "",
) -> RunResult:
    """Run every program once (greedy, outputs of fixed length) and time it all."""
    if concurrency is None and request_rate is None:
        raise ValueError("give a concurrency, a request rate, or both")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if request_rate is not None and request_rate <= 0:
        raise ValueError(f"request rate must be > 0 programs/s, got {request_rate}")
    log = CallLog()
    n = len(program_args)
    latencies: list[float] = []
    errors: list[str] = []
    states: list[Any] = [None] * n
    arrivals = _arrival_offsets(n, request_rate, seed)
    batch = ProgramBatch()  # Ctrl-C stops every program, not only the waiting

    def one(i: int, t0: float) -> None:
        if request_rate is not None and batch.interrupted.wait(max(0.0, t0 + arrivals[i] - time.perf_counter())):
            return  # Ctrl-C before this program's arrival
        began = t0 + arrivals[i] if request_rate is not None else time.perf_counter()
        state = workload.program.run_in_batch(
            batch, **program_args[i], backend=RecordingBackend(backend, log, i), temperature=0, ignore_eos=True
        )
        if state.error() is not None:  # a failed program counts as an error, not as a run
            raise state.error()
        latencies.append(time.perf_counter() - began)
        states[i] = state

    workers = concurrency if concurrency is not None else n
    bar = tqdm(total=n, desc=desc or workload.name, unit="prog", disable=not progress, leave=False)
    pool = ThreadPoolExecutor(max(1, min(workers, n)))
    with _PeakSampler(kv_probe) as sampler:
        t0 = time.perf_counter()
        futures = {pool.submit(one, i, t0): i for i in range(n)}
        try:
            for fut in as_completed(futures):
                if fut.exception() is not None:
                    errors.append(f"program {futures[fut]}: {fut.exception()}")
                bar.update()
        except BaseException:  # Ctrl-C: the running programs stop sending, the rest never start
            batch.interrupt()
            pool.shutdown(wait=False, cancel_futures=True)  # not waiting for the gens in flight
            raise
        finally:
            bar.close()
        wall = time.perf_counter() - t0
    pool.shutdown()
    return RunResult(log.records, latencies, wall, n, errors, sampler.peak, states)


def _arrival_offsets(n: int, rate: float | None, seed: int) -> list[float]:
    if rate is None:
        return [0.0] * n
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out
