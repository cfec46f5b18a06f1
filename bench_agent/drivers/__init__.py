"""The drivers a workload can run on, and how to watch a server's KV usage meanwhile.

- ``dsl``: the DSL's own backends: a forkserve (or SGLang) server's native API over HTTP,
  or the engine in-process. Forks prefill their shared prefix once; programs and branches
  run concurrently.
- ``openai``: any OpenAI-compatible chat server, one chat request per ``gen``.
- ``hf``: transformers in-process, one request at a time (the raw baseline).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from frontend_lang.backend.base import Backend, BackendError

DRIVERS = ("dsl", "openai", "hf")



@dataclass(frozen=True)
class KVReading:
    """One look at a server's KV pool, as fractions of it: what running requests use now,
    and the server's own high-water mark of that since its cache was last emptied (forkserve
    keeps one per forward step, so a burst shorter than the polling interval still shows;
    None where the server keeps none)."""

    now: float
    peak: float | None = None


KVProbe = Callable[[], KVReading | None]


# Sampling parameters the DSL always passes; at these values they change nothing.
_NEUTRAL: dict[str, Any] = {
    "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "top_k": -1, "top_p": 1.0, "stop": None, "stop_token_ids": None, "seed": None, "n": 1,
}


def check_sampling_params(params: dict[str, Any], supported: set[str], driver: str) -> None:
    """Refuse parameters a driver cannot honour, unless they are at their neutral value."""
    bad = sorted(k for k, v in params.items() if k not in supported and v not in (_NEUTRAL.get(k, object()), []))
    if bad:
        raise BackendError(f"the {driver} driver does not support {', '.join(bad)}")


def kv_usage_from_stats(stats: dict[str, Any]) -> KVReading:
    """Fraction of the KV pool held by running requests (their own slots plus the cached
    prefixes they lock); evictable cache does not count, it is free to reclaim."""
    capacity = stats["kv_capacity"]
    peak = stats.get("kv_peak_in_use")
    return KVReading((stats["kv_held_by_requests"] + stats["kv_protected"]) / capacity,
                     None if peak is None else peak / capacity)


# Gauges other servers export on /metrics, as fractions of their KV pool.
_FOREIGN_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")


def kv_probe_for_url(url: str, api_key: str | None = None) -> KVProbe | None:
    """A probe reading a server's KV usage: forkserve's ``/get_server_info``, else a known
    gauge on ``/metrics``; ``None`` when the server shows neither. ``api_key``: the bearer
    token a server started with one asks for."""
    root = url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.Client(base_url=root, timeout=10, headers=headers)

    def forkserve() -> KVReading | None:
        return kv_usage_from_stats(client.get("/get_server_info").json()["scheduler"])

    def gauge(name: str) -> KVReading | None:
        match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", client.get("/metrics").text, re.M)
        return KVReading(float(match.group(1))) if match else None

    try:
        forkserve()
        return forkserve
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        pass  # not forkserve
    try:
        metrics = client.get("/metrics")
        for name in _FOREIGN_GAUGES:
            if metrics.status_code == 200 and re.search(rf"^{re.escape(name)}\b", metrics.text, re.M):
                return lambda name=name: gauge(name)
    except (httpx.HTTPError, KeyError, ValueError):
        pass
    return None


def kv_probe_for_engine(backend: Any) -> KVProbe:
    return lambda: kv_usage_from_stats(backend.between_steps(backend.engine.scheduler.stats))


def flush_cache(backend: Backend) -> bool | None:
    """Empty the server's prefix cache between runs where the driver can (forkserve; over the
    OpenAI driver also SGLang, and vLLM in its development mode): whether it was emptied, or
    None for a driver with no prefix cache to empty (transformers)."""
    flush = getattr(backend, "flush_cache", None)
    return bool(flush()) if flush is not None else None
