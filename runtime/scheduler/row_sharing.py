"""Which call gives up a row when every row (``--max-running-requests``) is taken and a
request of another call waits (``Scheduler._yield_row`` carries it out).

The call holding the most running rows gives one up when it holds two more than the
waiting request's call and at least twice its fair share: the rows over the calls
holding some (a request alone is a call), counting the waiting one's if it holds none.
So one call's ``n`` 64 of long answers does not keep later calls waiting for a row until
it ends, while calls of a fair size (an agent's few forks among many programs, a flood of
calls of ``n`` 2) keep theirs, and a second call of 64 gets one row, not half (sharing
evenly would only delay the first call's end).

``admitted`` counts each call's admitted requests (those picked this step included), the
requests alone under the key ``None``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from runtime.scheduler.req import Req


class Hog(NamedTuple):
    """The call holding the most running rows."""

    group: str
    rows: int
    calls: int  # calls holding rows (a request alone is a call)


def call_that_may_yield(running: list[Req], admitted: Counter[str | None], max_running: int) -> Hog | None:
    """The call holding the most of the ``running`` rows, if it holds at least two and
    twice its fair share were one more call to get a row; else None (nobody may yield)."""
    held = Counter(r.group for r in running if r.group is not None)
    if not held:
        return None
    group, most = held.most_common(1)[0]
    calls = sum(1 for g, n in admitted.items() if g is not None and n > 0) + admitted[None]
    if most < 2 or most * (calls + 1) < 2 * max_running:
        return None
    return Hog(group, most, calls)


def yields_to(first: Req, hog: Hog, admitted: Counter[str | None], max_running: int) -> bool:
    """Whether ``hog`` gives a row to ``first``, the next waiting request in fair order."""
    has = admitted[first.group] if first.group is not None else 0
    if hog.group == first.group or hog.rows < has + 2:
        return False
    return hog.rows * (hog.calls + (has == 0)) >= 2 * max_running
