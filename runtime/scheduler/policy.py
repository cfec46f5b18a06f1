"""The order in which waiting requests are considered for prefill."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

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
    already waited and hold partial output), then requests passed over too often."""
    reqs = list(waiting)
    if policy == "fcfs" or len(reqs) > LPM_MAX_QUEUE or cache.tree.disable:
        return sorted(reqs, key=lambda r: not r.is_retracted)

    def match(r: Req) -> int:
        n = cache.match_len(r)
        return n if n >= LPM_MIN_MATCH else 0

    prefix = {id(r): match(r) for r in reqs}
    return sorted(reqs, key=lambda r: (not r.is_retracted, r.num_passed_over < MAX_PASSED_OVER, -prefix[id(r)]))
