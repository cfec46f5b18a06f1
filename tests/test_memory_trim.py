"""``runtime/server/memory_trim.py``: the HTTP process gives back what a large request freed
(glibc keeps it otherwise: +700 MB for good after a 10 MB ``/tokenize``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from runtime.process_memory import glibc_trim, resident_mib
from runtime.server.memory_trim import trim_when_grown

pytestmark = pytest.mark.skipif(glibc_trim() is None or resident_mib() is None, reason="glibc on Linux only")

# Half a GB of 4 KB blocks (malloc'd, not Python's small-object pool), every 64th kept so
# the heap's top stays in use and glibc's own trimming at free cannot return the rest.
_FRAGMENT = """
import sys
from runtime.process_memory import glibc_trim, resident_mib
start = resident_mib()
blocks = [bytearray(4096) for _ in range(128_000)]
kept = blocks[::64]
del blocks
held = resident_mib()
glibc_trim()()
print(start, held, resident_mib())
"""


def test_glibc_trim_returns_freed_memory_the_heap_kept():
    start, held, trimmed = map(int, subprocess.run([sys.executable, "-c", _FRAGMENT], capture_output=True,
                                                  text=True, check=True, timeout=120).stdout.split())
    assert held - start > 300, (start, held)  # glibc kept what was freed
    assert trimmed - start < 100, (start, held, trimmed)


def _trims(sizes: list[int], again_s: float) -> list[int]:
    """The resident sizes (MiB) at which ``trim_when_grown`` trimmed, the process's size
    reading ``sizes`` in turn (the first at start; after a trim, one is read for its result)."""
    readings, trimmed_at, last = list(sizes), [], [0]
    done = asyncio.Event()

    def resident() -> int:
        if len(readings) == 1:
            done.set()
        last[0] = readings.pop(0) if len(readings) > 1 else readings[0]
        return last[0]

    async def scenario() -> None:
        task = asyncio.create_task(trim_when_grown(256, period_s=0, again_s=again_s, resident=resident,
                                                   trim=lambda: trimmed_at.append(last[0]) or 1))
        await done.wait()
        task.cancel()

    asyncio.run(scenario())
    return trimmed_at


def test_trims_once_grown_by_the_threshold_then_only_after_more_growth():
    sizes = [100,  # at start
             300, 350,  # below start + 256: nothing
             400, 390,  # grown 300: trim; 390 after it
             400, 420,  # little more since the trim: not again so soon
             460, 200,  # 70 more than after the trim (>= 256 // 4): trim; 200 after
             250, 300, 300]  # below start + 256 again: nothing
    assert _trims(sizes, again_s=1e9) == [400, 460]


def test_trims_again_after_a_while_what_a_finished_request_freed():
    """A trim in the middle of a large request returns little; the next, once ``again_s``
    has passed, returns what the request freed at its end."""
    sizes = [100, 400, 390] + [395] * 20  # after the first trim, each reads the size twice
    assert _trims(sizes, again_s=0) == [400] + [395] * 10
    assert _trims(sizes, again_s=1e9) == [400]


def test_a_trim_that_gives_nothing_back_waits_longer_each_time():
    """Memory in use stays in use: trimming it every ``again_s`` only holds glibc's locks."""
    sizes = iter([100])
    trims = []

    async def scenario() -> None:
        task = asyncio.create_task(trim_when_grown(256, period_s=0.001, again_s=0.02,
                                                   resident=lambda: next(sizes, 400), trim=lambda: trims.append(1) or 1))
        await asyncio.sleep(0.6)
        task.cancel()

    asyncio.run(scenario())
    assert 3 <= len(trims) <= 8, len(trims)  # 0.02, 0.04, 0.08, ... s apart; every 0.02 s would be ~30


_ENGINE = """
from runtime.engine import Engine
from runtime.process_memory import resident_mib
start = resident_mib()
engine = Engine(dtype="float32", max_total_tokens=4096)
engine.generate("Hello", {"max_new_tokens": 2})
loaded = resident_mib()
engine.shutdown()  # the engine stays referenced, as in a notebook that makes a new one
print(start, loaded, resident_mib())
"""


@pytest.mark.slow
def test_an_engine_shut_down_gives_its_memory_back_while_still_referenced():
    """SGLang's Engine.shutdown ends its processes, so their memory goes; ours kept the
    weights and the KV pool (1.4 GB for the default model) until the object was collected."""
    start, loaded, after = map(int, subprocess.run([sys.executable, "-c", _ENGINE], capture_output=True, text=True,
                                                   check=True, timeout=300).stdout.split())
    assert loaded - start > 400, (start, loaded)
    assert after - start < (loaded - start) / 4, (start, loaded, after)
