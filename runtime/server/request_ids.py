"""Which request ids a client's ``rid`` gives its requests (``/generate`` and the OpenAI
routes, as SGLang names them), and the requests still arriving, which an ``/abort_request``
must end too."""

from __future__ import annotations

import weakref
from typing import Any

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


class ArrivingRequests:
    """HTTP requests whose body the server has begun to read and whose generation requests
    are not yet submitted (the prompt is still being read, tokenized or templated). An
    ``/abort_request`` that comes meanwhile is noted on each of them (``request.state.aborts``:
    the rids, None for all) and ends their requests as soon as they are submitted, as it
    ends those already running. Held weakly: a request that never submits (a 400, a route
    that does not generate) leaves when its handler does."""

    def __init__(self) -> None:
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()

    def arrive(self, request: Any) -> None:
        request.state.aborts = set()
        self._open.add(request)

    def abort(self, rid: str | None, abort_all: bool) -> None:
        for request in list(self._open):
            if abort_all:
                request.state.aborts.add(None)
            elif rid:
                request.state.aborts.add(rid)

    def submitted(self, request: Any) -> set[str | None]:
        """The aborts that came while ``request`` arrived; it is no longer arriving."""
        self._open.discard(request)
        return getattr(request.state, "aborts", set())
