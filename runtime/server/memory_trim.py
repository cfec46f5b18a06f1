"""Give the memory a large request freed back to the system, in the HTTP process.

glibc keeps freed memory inside the process unless it lies at the top of its heap: after
a 10 MB ``/tokenize`` the HTTP process stayed ~700 MB larger, and over a long session of
large requests it grew from 330 MB to 2.9 GB and never shrank. ``trim_when_grown`` checks
the resident size every few seconds and, once it is ``grown_mib`` above its size at start,
asks glibc to return what is free (``malloc_trim``), on a worker thread. Elsewhere than
glibc it does nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runtime.process_memory import glibc_trim, resident_mib


async def trim_when_grown(grown_mib: int = 256, period_s: float = 5.0, again_s: float = 30.0, *,
                          resident: Callable[[], int | None] = resident_mib,
                          trim: Callable[[], int] | None = None) -> None:
    """Run for the server's life (cancel to stop): every ``period_s``, if the process is
    ``grown_mib`` above its size at start, trim; after a trim, not again within ``again_s``
    unless the process grew by a quarter of ``grown_mib`` since (a trim in the middle of a
    large request returns little; what the request frees at its end goes at the next).
    A trim that gave back less than that doubles the wait (up to 20 times ``again_s``):
    memory in use stays in use, and a trim holds glibc's locks (26 ms for a 500 MB heap,
    the event loop's allocations waiting). ``resident`` and ``trim``: this process's
    (tests give their own)."""
    trim = trim or glibc_trim()
    floor = resident()
    if trim is None or floor is None:
        return
    after, at, wait = None, 0.0, again_s
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(period_s)
        now = resident() or floor
        if now - floor < grown_mib:
            continue
        if after is not None and now - after < grown_mib // 4 and loop.time() - at < wait:
            continue
        await asyncio.to_thread(trim)
        after, at = resident() or now, loop.time()
        wait = again_s if now - after >= grown_mib // 4 else min(2 * wait, 20 * again_s)
