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


def order_waiting(waiting: Iterable[Req], policy: str, cache: CacheManager) -> list[Req]:
    """``lpm``: longest cached prefix first (ties keep arrival order); ``fcfs``: arrival order.
    Retracted requests always go first: they already waited and hold partial output."""
    reqs = list(waiting)
    if policy == "fcfs" or len(reqs) > LPM_MAX_QUEUE or cache.tree.disable:
        return sorted(reqs, key=lambda r: not r.is_retracted)
    prefix = {id(r): cache.match_len(r) for r in reqs}
    return sorted(reqs, key=lambda r: (not r.is_retracted, -prefix[id(r)]))
