"""The requests waiting for prefill: in arrival order (a retracted request goes back in
front), and also by group, so that ordering them fairly over groups needs no walk over a
long queue.

A group is the requests of one call (the ``n`` samples of a prompt, the prompts of a
batch): ``Req.group``, None for a request alone. Each request alone is a group of its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.scheduler.req import Req


class WaitingQueue:
    def __init__(self) -> None:
        self._reqs: deque[Req] = deque()
        # group -> its waiting members in queue order; None: every request alone, together
        self._groups: dict[str | None, deque[Req]] = {}

    def append(self, req: Req) -> None:
        self._reqs.append(req)
        self._groups.setdefault(req.group, deque()).append(req)

    def appendleft(self, req: Req) -> None:
        self._reqs.appendleft(req)
        self._groups.setdefault(req.group, deque()).appendleft(req)

    def extend(self, reqs: list[Req]) -> None:
        for req in reqs:
            self.append(req)

    def remove(self, req: Req) -> None:
        self._reqs.remove(req)
        members = self._groups[req.group]
        members.remove(req)
        if not members:
            del self._groups[req.group]

    def groups(self) -> dict[str | None, deque[Req]]:
        """Each group's waiting members in queue order (key None: the requests alone)."""
        return self._groups

    def __iter__(self) -> Iterator[Req]:
        return iter(self._reqs)

    def __len__(self) -> int:
        return len(self._reqs)

    def __bool__(self) -> bool:
        return bool(self._reqs)

    def __contains__(self, req: object) -> bool:
        return req in self._reqs
