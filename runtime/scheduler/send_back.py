"""Sending admitted requests back to the waiting queue, and the decode reserve it tunes.

Two reasons send a request back: memory (a decode step needs a slot for each running request
and the pool is short: ``Scheduler._give_up_memory`` picks who goes) and rows (a call gives a
row up to a waiting request of another call: ``row_sharing.py``, ``Scheduler._yield_row``).
Either way the request's computed KV goes to the tree, so it comes back computing only what
the tree no longer holds (usually one token).

The decode reserve is what a prefill step must leave free for the running requests' future
decode tokens (``prefill_budget.py``): a fraction (the new-token ratio) of what each may still
generate. It starts optimistic, since finished requests free memory, decays each decode step,
and goes back up whenever a request is sent back for memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from runtime.scheduler.cache_manager import CacheManager
from runtime.scheduler.prefill_budget import PrefillBudget
from runtime.scheduler.req import Req
from runtime.scheduler.waiting_queue import WaitingQueue

logger = logging.getLogger("forkserve")

INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, NEW_TOKEN_RATIO_DECAY = 0.7, 0.1, 0.001


class SendBack:
    """Puts requests back in the queue (their KV to the tree) and keeps the count of each
    reason and the new-token ratio of the decode reserve."""

    def __init__(self, cache: CacheManager, waiting: WaitingQueue) -> None:
        self.cache = cache
        self.waiting = waiting
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.num_retractions = 0  # sent back for memory
        self.num_rows_yielded = 0  # sent back so a call with fewer rows could start

    def for_memory(self, req: Req) -> None:
        """``req`` goes back first in the queue; the reserve starts optimistic no more."""
        self._put_back(req, yielded=False)
        self.num_retractions += 1
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        logger.info("retracted request %s to free KV memory", req.rid)

    def yielding_row(self, req: Req) -> None:
        """``req`` gives its row up and waits ranked with its call (``Req.yielded``,
        ``policy.order_waiting``)."""
        self._put_back(req, yielded=True)
        self.num_rows_yielded += 1

    def _put_back(self, req: Req, yielded: bool) -> None:
        self.cache.release(req)
        req.is_retracted = True
        req.yielded = yielded
        if not req.output_ids:  # part-way through its prompt: its prompt logprobs start over
            req.input_token_logprobs.clear()
            req.input_top_logprobs.clear()
            req.input_token_ranks.clear()
        self.waiting.put_back(req)

    def decay(self) -> None:
        """One decode step without a retraction: the reserve may shrink a little."""
        self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)

    def decode_reserve(self, running: Iterable[Req]) -> float:
        """KV slots the running requests may still need for their decode tokens."""
        return sum(PrefillBudget.expected_decode_tokens(r.params.max_new_tokens - len(r.output_ids),
                                                        self.new_token_ratio) for r in running)

    def expected_decode_tokens(self, req: Req) -> float:
        """What a newly admitted ``req`` adds to the reserve."""
        return PrefillBudget.expected_decode_tokens(req.params.max_new_tokens, self.new_token_ratio)


def least_progress(reqs: Iterable[Req]) -> Req:
    """The request to send back: the least output so far (the least lost); at equal output,
    the longer prompt (it frees the most slots, and its KV waits in the tree)."""
    return min(reqs, key=lambda r: (len(r.output_ids), -len(r.input_ids)))
