"""Which request ids a client's ``rid`` gives its requests (``/generate`` and the OpenAI
routes, as SGLang names them), and which requests ``/abort_request`` ends under it, also
those that had arrived but were still being tokenized when the abort came."""

from __future__ import annotations

import math
import time

from runtime.server.protocol import ApiError


def request_ids(rid: str | list[str] | None, samples: list[int]) -> list[tuple[str, str]] | None:
    """(request id, the id the client gave it) of prompts with ``samples[i]`` requests each
    (their ``n``): a client's one id becomes ``rid_0``, ``rid_1``, ... when there are several;
    a list has one id per prompt (SGLang's rule: expanded so for ``n > 1``) or one per request."""
    if rid is None:
        return None
    total = sum(samples)
    if isinstance(rid, str):
        return [(rid, rid)] if total == 1 else [(f"{rid}_{i}", rid) for i in range(total)]
    if len(rid) == total:
        return [(r, r) for r in rid]
    if len(rid) == len(samples):
        return [(r if n == 1 else f"{r}_{k}", r) for r, n in zip(rid, samples, strict=True) for k in range(n)]
    raise ApiError(400, f"got {len(rid)} rids for {len(samples)} prompts ({total} requests): give one per prompt "
                        "or one per request", param="rid")


class AbortLedger:
    """The ``/abort_request`` calls of the last minute, so that a request that had arrived
    before one (its prompt still being tokenized or templated, so not yet submitted) is
    ended as soon as it is submitted, as one already running would be."""

    KEEP_S = 60.0  # far longer than any request takes from arrival to submission

    def __init__(self) -> None:
        self.by_rid: dict[str, float] = {}
        self.all_at = -math.inf

    def record(self, rid: str | None, abort_all: bool) -> None:
        now = time.monotonic()
        if abort_all:
            self.all_at = now
        if rid:
            self.by_rid[rid] = now
        for old in [r for r, t in self.by_rid.items() if now - t > self.KEEP_S]:
            del self.by_rid[old]

    def applies(self, client_rid: str | None, arrived_at: float) -> bool:
        """Whether an abort came after a request with that client id arrived."""
        return self.all_at >= arrived_at or (client_rid is not None and
                                             self.by_rid.get(client_rid, -math.inf) >= arrived_at)
