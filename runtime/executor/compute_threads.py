"""How many threads a CPU step computes on while other processes keep cores busy.

A step of the compiled CPU kernels is ~300 OpenMP regions, each ending in a barrier that
waits for every thread of the team. When another process takes a core, one of our threads
is preempted in most regions and the other waits for it at the barrier: with one busy
process beside a 2-core server, tree of thought ran 3.1x slower on 2 threads (vLLM's CPU
build: 3.2x) but 1.5x slower on 1 thread. So, by default, the worker drops a thread for
each core other processes keep busy and takes it back when they stop (measured: 0.95 ->
1.7 programs/s beside the busy process, unchanged on a quiet machine, where a benchmark
client and the HTTP process read 0.1-0.3 of a core).

"Other processes" is the machine's busy time (``/proc/stat``, steal included: a hypervisor
taking the core stalls the barrier just the same) less this process's own CPU time, in
cores, averaged over windows of ``WINDOW_S``. A core counts as taken from ``TAKEN`` of it
and as free again below ``FREE`` (so a benchmark client or the HTTP process, a few tenths
of a core, never costs a thread), and a change needs two windows in a row that call for it.
Outputs do not depend on the thread count (every kernel gives each output element to one
thread), so switching changes speed only.

``--num-threads`` fixes the count (no adaptation), as do tensor parallelism and non-CPU
devices.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

logger = logging.getLogger("forkserve")

WINDOW_S = 0.5
TAKEN = 0.6  # of a core, busy in other processes: that core is taken
FREE = 0.4  # below this, free again


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine_busy_seconds() -> float | None:
    """Seconds of CPU time the whole machine has spent busy (every state but idle and
    iowait, steal included) since boot, or None where ``/proc/stat`` is not there."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    return time.process_time()


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
                 own: Callable[[], float] = own_cpu_seconds, clock: Callable[[], float] = time.monotonic) -> None:
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
