"""The order in which waiting requests are considered for prefill, and which of them wait a
step for a request picked before them to compute a prefix they share."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from runtime.scheduler.cache_manager import CacheManager
    from runtime.scheduler.req import Req
    from runtime.scheduler.waiting_queue import WaitingQueue

# Matching every waiting request costs a tree walk each; past this queue length the gain
# from better ordering is not worth it and we fall back to arrival order (as SGLang does).
LPM_MAX_QUEUE = 128
# A cached prefix shorter than this does not earn a request a place ahead of older ones.
LPM_MIN_MATCH = 32
# A request passed over by this many prefill batches goes ahead of everything that came
# later, however well they match: longest-prefix-first alone can starve a request forever.
MAX_PASSED_OVER = 8


def order_waiting(waiting: WaitingQueue, policy: str, cache: CacheManager,
                  running: Counter[str | None]) -> Iterable[Req]:
    """``lpm``: longest cached prefix first (ties, and matches under ``LPM_MIN_MATCH``
    tokens, keep arrival order); ``fcfs``: arrival order. Requests retracted for memory go
    first (they already waited and hold partial output), then requests passed over too
    often (``lpm``; ``fcfs`` is arrival order already), in arrival order. Over the rest,
    fairness between groups (``Req.group``): the k-th waiting member of a group with r
    members admitted goes as the (r + k)-th, so the samples of an ``n`` 128 or a batch of
    100k prompts do not hold every later request until they are all done; ``running``
    counts each group's admitted members, and the retracted count first in their group's
    k. A request that yielded its row to another call (``Req.yielded``) ranks with its
    group too, first among its rank, the longest waiting first: put first, it would take
    its row straight back. Past ``LPM_MAX_QUEUE`` the order is made as it is taken (the
    caller stops after a step's worth)."""
    seen: Counter[str] = Counter()
    put_back = waiting.put_back_requests()  # the most recently put back first
    front = [r for r in put_back if not r.yielded]
    seen.update(r.group for r in front if r.group is not None)  # they count first in their group's k
    yielded = [(_next_rank(r.group, running, seen), r) for r in reversed(put_back) if r.yielded]
    if policy == "fcfs" or len(waiting) > LPM_MAX_QUEUE or cache.tree.disable:
        return itertools.chain(front, _fair_merge(waiting, running, yielded, seen))

    def match(r: Req) -> int:
        n = cache.match_len(r)
        return n if n >= LPM_MIN_MATCH else 0

    def key(r: Req) -> tuple[bool, int]:
        late = waiting.passed_over(r) >= MAX_PASSED_OVER
        # the late keep arrival order among themselves: sorted by prefix again, a queue kept
        # full of matching requests (all of them late soon) would starve an unmatched one
        return not late, 0 if late else -match(r)

    ranked = yielded + [(_next_rank(r.group, running, seen), r) for r in sorted(waiting.arrived(), key=key)]
    return front + [r for _, r in sorted(ranked, key=lambda pair: pair[0])]  # stable: yielded first among equals


def _next_rank(group: str | None, running: Counter[str | None], seen: Counter[str]) -> int:
    """The rank of a group's next waiting member (0 for a request alone), counted as seen."""
    if group is None:
        return 0
    rank = running.get(group, 0) + seen[group]
    seen[group] += 1
    return rank


# Most members of one group a step looks at (it admits at most --max-running-requests).
MERGE_DEPTH = 1024


def _fair_merge(waiting: WaitingQueue, running: Counter[str | None], yielded: list[tuple[int, Req]],
                seen: Counter[str]) -> Iterator[Req]:
    """The ranked requests that yielded their rows and the arrived requests in arrival
    order, fair between groups (see ``order_waiting``): a merge of the groups' queues by the
    rank of each one's next member, ties by arrival (those that yielded a row before any
    arrival). Costs a heap of one entry per group and per request that yielded a row; a
    group's first ``MERGE_DEPTH`` members are copied when it first comes up (the caller
    takes requests out of the queue as it goes, only those it was given, so until then the
    group is as it was)."""
    groups = list(waiting.arrived_by_group().items())
    stamp = waiting.stamp
    # (rank, tie-break, group index or -1 for the yielded, position); the yielded: negative stamps
    heap = [(rank, j - len(yielded), -1, j) for j, (rank, _) in enumerate(yielded)]
    heap += [(_next_rank(g, running, seen), stamp(members[0]), i, 0) for i, (g, members) in enumerate(groups)]
    heapq.heapify(heap)
    copies: dict[int, list[Req]] = {}
    while heap:
        _, _, i, pos = heapq.heappop(heap)
        if i < 0:
            yield yielded[pos][1]
            continue
        group, members = groups[i]
        queue = copies.get(i)
        if queue is None:
            queue = copies[i] = list(itertools.islice(members, MERGE_DEPTH))
        yield queue[pos]
        if pos + 1 < len(queue):
            heapq.heappush(heap, (_next_rank(group, running, seen), stamp(queue[pos + 1]), i, pos + 1))


# Deferring a request is worth a step of its latency only when it saves real prefill work.
MIN_SHARED_TO_DEFER = 32


def shares_uncached_prefix(req: Req, cached: int, picked: list[tuple[Req, int]]) -> bool:
    """Whether a request already picked this step will compute at least
    ``MIN_SHARED_TO_DEFER`` tokens of ``req``'s prompt beyond what the cache holds."""
    ids = np.asarray(req.fill_ids[: req.max_reusable_prefix], dtype=np.int64)
    if len(ids) - cached < MIN_SHARED_TO_DEFER:
        return False
    for other, n in picked:
        if other.options.namespace != req.options.namespace:
            continue
        theirs = np.asarray(other.fill_ids[: other.kv_len + n], dtype=np.int64)
        m = min(len(ids), len(theirs))
        diff = np.flatnonzero(ids[:m] != theirs[:m])
        common = int(diff[0]) if diff.size else m
        if common - cached >= MIN_SHARED_TO_DEFER:
            return True
    return False
