"""How a request's results are reported and cached, beside what is sampled
(``SamplingParams``): one object from the edge (``Engine.generate``, ``/generate``, the
OpenAI routes) through the scheduler process's message to the scheduler's ``Req``, so a new
option is a field here and the code that uses it, not a parameter threaded through every
signature on the way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestOptions:
    stream: bool = False  # report every new token, not only the finished result
    return_logprob: bool = False
    logprob_start_len: int = -1  # prompt logprobs from this position on (-1: none)
    top_logprobs_num: int = 0
    namespace: Any = None  # cached prefixes are shared only within one namespace
    program_id: str | None = None  # pins the prompt's prefix in the cache until the program ends
    prompt_top_logprobs_num: int | None = None  # the prompt's top logprobs, where not top_logprobs_num (vLLM's prompt_logprobs)


def cache_namespace(extra_key: str | None, cache_salt: str | None) -> tuple[str | None, str | None] | None:
    """The cache namespace of a request's ``extra_key`` and ``cache_salt`` (SGLang's and
    vLLM's): both count, so a gateway's key does not merge two tenants' salts."""
    extra_key, cache_salt = extra_key or None, cache_salt or None  # "" is no key, as before
    return None if extra_key is None and cache_salt is None else (extra_key, cache_salt)
