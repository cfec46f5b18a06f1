"""The order in which waiting requests are considered for prefill, and which of them wait a
step for a request picked before them to compute a prefix they share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from runtime.scheduler.cache_manager import CacheManager
    from runtime.scheduler.req import Req

# Matching every waiting request costs a tree walk each; past this queue length the gain
# from better ordering is not worth it and we fall back to arrival order (as SGLang does).
LPM_MAX_QUEUE = 128
# A cached prefix shorter than this does not earn a request a place ahead of older ones.
LPM_MIN_MATCH = 32
# A request passed over by this many prefill batches goes ahead of everything that came
# later, however well they match: longest-prefix-first alone can starve a request forever.
MAX_PASSED_OVER = 8


def order_waiting(waiting: Iterable[Req], policy: str, cache: CacheManager) -> list[Req]:
    """``lpm``: longest cached prefix first (ties, and matches under ``LPM_MIN_MATCH``
    tokens, keep arrival order); ``fcfs``: arrival order. Retracted requests go first (they
    already waited and hold partial output), then requests passed over too often, in arrival
    order."""
    reqs = list(waiting)
    if policy == "fcfs" or len(reqs) > LPM_MAX_QUEUE or cache.tree.disable:
        return sorted(reqs, key=lambda r: not r.is_retracted)

    def match(r: Req) -> int:
        n = cache.match_len(r)
        return n if n >= LPM_MIN_MATCH else 0

    def key(r: Req) -> tuple[bool, bool, int]:
        late = r.num_passed_over >= MAX_PASSED_OVER
        # the late keep arrival order among themselves: sorted by prefix again, a queue kept
        # full of matching requests (all of them late soon) would starve an unmatched one
        return not r.is_retracted, not late, 0 if late else -match(r)

    return sorted(reqs, key=key)


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
