"""How many threads a CPU step computes on while other processes keep cores busy.

A step of the compiled CPU kernels is ~300 OpenMP regions, each ending in a barrier that
waits for every thread of the team. When another process takes a core, one of our threads
is preempted in most regions and the other waits for it at the barrier: with one busy
process beside a 2-core server, tree of thought ran 3.1x slower on 2 threads (vLLM's CPU
build: 3.2x) but 1.5x slower on 1 thread. So the server's scheduler process drops a thread
for each core other processes keep busy and takes it back when they stop (measured: 0.95 ->
1.7 programs/s beside the busy process, unchanged on a quiet machine, where a benchmark
client and the HTTP process read 0.1-0.3 of a core).

"Other processes" is the busy time of the cores this process may run on (their lines of
``/proc/stat``, steal included: a hypervisor taking the core stalls the barrier just the
same) less this process's own CPU time, in cores, averaged over windows of ``WINDOW_S``. A
core counts as taken from ``TAKEN`` of it and as free again below ``FREE`` (so a benchmark
client or the HTTP process, a few tenths of a core, never costs a thread), and a change
needs two windows in a row that call for it.

Where it applies (``adapts``): the server's scheduler process (an in-process ``Engine``
shares its process, and its CPU time, with the caller's program), on CPU with one rank, with
the compiled decoder layers (their kernels take the thread count per call and give each
output element to one thread, so outputs do not depend on it: tests/test_compute_threads.py;
oneDNN's and PyTorch's own ops make no such promise), and no count asked for
(``--num-threads``, ``OMP_NUM_THREADS``) or more threads than cores. Not followed: the
kernel choices measured at start for the full count (``kernels/cpu/gemm_choice.py``,
``attention_choice.py``) stay, and ``/get_server_info``'s ``num_threads`` is the full count.
The count is set with ``torch.set_num_threads`` on the thread that steps (OpenMP keeps it
per thread).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.config import ServerArgs
    from runtime.executor.worker import ModelWorker

logger = logging.getLogger("forkserve")

WINDOW_S = 0.5
TAKEN = 0.6  # of a core, busy in other processes: that core is taken
FREE = 0.4  # below this, free again


def _own_cpus() -> set[int] | None:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def available_cores() -> int:
    """The cores this process may run on."""
    cpus = _own_cpus()
    return len(cpus) if cpus is not None else (os.cpu_count() or 1)


def machine_busy_seconds(cpus: set[int] | None = None, stat: str = "/proc/stat") -> float | None:
    """Seconds of CPU time ``cpus`` (default: those this process may run on) have spent busy
    since boot: user, nice, system, irq, softirq and steal (guest time is inside user and
    nice already); None where ``stat`` cannot be read. The cpu lines come first (proc(5)):
    the reading stops at the next line (``intr``, thousands of counters on a large machine)."""
    cpus = _own_cpus() if cpus is None else cpus
    busy = 0
    try:
        with open(stat) as f:
            for line in f:
                if not line.startswith("cpu"):
                    break
                name, *values = line.split()
                if name == "cpu" or (cpus is not None and int(name[3:]) not in cpus):
                    continue
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in (values + ["0"] * 8)[:8])
                busy += user + nice + system + irq + softirq + steal
    except (OSError, ValueError):
        return None
    return busy / os.sysconf("SC_CLK_TCK")


def adapts(args: ServerArgs, worker: ModelWorker) -> bool:
    """Whether the server's worker should follow other processes' load (see above)."""
    import torch  # the worker's process has it; importing this module needs none

    threads = torch.get_num_threads()
    return (args.resolved_device == "cpu" and args.num_threads is None and "OMP_NUM_THREADS" not in os.environ
            and worker.tp.size == 1 and worker.model.compiled_layers is not None and 1 < threads <= available_cores())


def threads_for(others: float, cores: int, most: int, current: int) -> int:
    """The thread count for ``others`` cores busy in other processes on a machine of
    ``cores``, at most ``most``, starting from ``current`` (hysteresis between ``FREE`` and
    ``TAKEN``)."""
    fewer = max(1, min(most, cores - int(others + (1 - TAKEN))))
    more = max(1, min(most, cores - int(others + (1 - FREE))))
    if fewer < current:
        return fewer
    return more if more > current else current


class ComputeThreads:
    """Call ``update()`` before each step: at most every ``WINDOW_S`` it reads the machine's
    and this process's CPU time and, when two windows in a row call for another count, sets
    torch's thread count (which the CPU kernels use) and logs it."""

    def __init__(self, most: int, cores: int, busy: Callable[[], float | None] = machine_busy_seconds,
                 own: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic) -> None:
        self.most, self.cores, self.current = most, cores, most
        self._busy, self._own, self._clock = busy, own, clock
        self._last = self._sample()
        self._wanted: int | None = None  # what the previous window called for

    def _sample(self) -> tuple[float, float | None, float]:
        return self._clock(), self._busy(), self._own()

    def update(self) -> int:
        now = self._clock()
        if now - self._last[0] < WINDOW_S:
            return self.current
        sample = self._sample()
        (t0, busy0, own0), (t1, busy1, own1) = self._last, sample
        self._last = sample
        if busy0 is None or busy1 is None:
            return self.current
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0)
        wanted = threads_for(others, self.cores, self.most, self.current)
        if wanted != self.current and wanted == self._wanted:
            logger.info("other processes keep %.1f of %d cores busy: computing on %d thread%s (at most %d)",
                        others, self.cores, wanted, "" if wanted == 1 else "s", self.most)
            import torch  # the worker's process has it loaded; importing this module needs none

            self.current = wanted
            torch.set_num_threads(wanted)
        self._wanted = wanted
        return self.current
