"""Which request ids a client's ``rid`` gives its requests (``/generate`` and the OpenAI
routes, as SGLang names them), and which requests ``/abort_request`` finds under it."""

from __future__ import annotations

from runtime.server.protocol import ApiError


def request_ids(rid: str | list[str] | None, samples: list[int]) -> list[str] | None:
    """The request ids of prompts with ``samples[i]`` requests each (their ``n``): a client's
    one id becomes ``rid_0``, ``rid_1``, ... when there are several; a list has one id per
    prompt (SGLang's rule: expanded so for ``n > 1``) or one per request."""
    if rid is None:
        return None
    total = sum(samples)
    if isinstance(rid, str):
        return [rid] if total == 1 else [f"{rid}_{i}" for i in range(total)]
    if len(rid) == total:
        return rid
    if len(rid) == len(samples):
        return [r if n == 1 else f"{r}_{k}" for r, n in zip(rid, samples, strict=True) for k in range(n)]
    raise ApiError(400, f"got {len(rid)} rids for {len(samples)} prompts ({total} requests): give one per prompt "
                        "or one per request", param="rid")


def runs_under(rid: str, given: str) -> bool:
    """Whether request ``rid`` is one a client sent as ``given`` (``request_ids``: itself, or a
    batch's or ``n > 1``'s ``given_0``, ``given_1``, ...)."""
    return bool(given) and (rid == given or rid.startswith(given + "_"))
