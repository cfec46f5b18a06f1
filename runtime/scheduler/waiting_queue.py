"""The requests waiting for prefill: requests put back (retracted, most recent first), then
arrivals in order; the arrivals also by group, so that ordering them fairly over groups
(``policy.order_waiting``, which decides the order they are considered in) needs no walk
over a long queue.

A group is the requests of one call (the ``n`` samples of a prompt, the prompts of a
batch): ``Req.group``, None for a request alone. Each request alone is a group of its own.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.scheduler.req import Req


class WaitingQueue:
    def __init__(self) -> None:
        self._put_back: deque[Req] = deque()
        self._arrived: dict[Req, int] = {}  # in arrival order, each with its stamp (its place in it)
        # group -> its arrived members in order; None: every request alone, together
        self._groups: dict[str | None, deque[Req]] = {}
        self._by_rid: dict[str, Req] = {}  # an abort of each of 100k requests finds its own at once
        self._count = itertools.count()
        # Prefill batches formed so far, and the number when each waiting request came in:
        # how often a request was passed over is a subtraction, not a walk of the queue per step.
        self._batches = 0
        self._entered: dict[Req, int] = {}

    def append(self, req: Req) -> None:
        """A request arriving (new, or its grammar compiled)."""
        self._arrived[req] = next(self._count)
        self._groups.setdefault(req.group, deque()).append(req)
        self._by_rid[req.rid] = req
        self._entered[req] = self._batches

    def put_back(self, req: Req) -> None:
        """A request sent back from running (retracted): it goes first, unless it yielded
        its row to another call (``Req.yielded``: ranked with its call, ``order_waiting``)."""
        self._put_back.appendleft(req)
        self._by_rid[req.rid] = req
        self._entered[req] = self._batches

    def extend(self, reqs: list[Req]) -> None:
        for req in reqs:
            self.append(req)

    def remove(self, req: Req) -> None:
        del self._by_rid[req.rid]
        req.num_passed_over += self._batches - self._entered.pop(req)
        if req in self._put_back:
            self._put_back.remove(req)
            return
        del self._arrived[req]
        members = self._groups[req.group]
        members.remove(req)  # taken from near its group's front, mostly
        if not members:
            del self._groups[req.group]

    def batch_formed(self) -> None:
        """A prefill batch was formed from the requests taken out: every one still waiting
        was passed over once more."""
        self._batches += 1

    def passed_over(self, req: Req) -> int:
        """Prefill batches formed while ``req`` waited (this time and any before)."""
        return req.num_passed_over + self._batches - self._entered[req]

    def find(self, rid: str) -> Req | None:
        return self._by_rid.get(rid)

    def put_back_requests(self) -> list[Req]:
        return list(self._put_back)

    def arrived(self) -> list[Req]:
        return list(self._arrived)

    def arrived_by_group(self) -> dict[str | None, deque[Req]]:
        """Each group's arrived members in order (key None: the requests alone)."""
        return self._groups

    def stamp(self, req: Req) -> int:
        """Where an arrived request came in, across groups (smaller: earlier)."""
        return self._arrived[req]

    def __iter__(self) -> Iterator[Req]:
        return itertools.chain(self._put_back, self._arrived)

    def __len__(self) -> int:
        return len(self._put_back) + len(self._arrived)

    def __bool__(self) -> bool:
        return bool(self._put_back or self._arrived)

    def __contains__(self, req: object) -> bool:
        return req in self._put_back or req in self._arrived
