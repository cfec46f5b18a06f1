"""The routing rules of SGLang's model gateway, as its documentation states them, over the
facts the gateway has: the requests it has sent to each replica (not what the replicas
still cache) and how many of them are still in flight.

- ``cache_aware``: if the in-flight counts are out of balance (max - min above an absolute
  threshold and max above a relative threshold times min), the least loaded replica;
  otherwise the replica whose past requests share the longest prefix with this one, if
  that prefix is more than ``cache_threshold`` of the request, else the least loaded. The
  gateway matches characters in an approximate tree; this matches tokens in blocks of
  ``BLOCK`` (a prefix index keyed by the hash of each block-aligned prefix).
- ``round_robin``: in turn.
- ``power_of_two``: the less loaded of two distinct random replicas.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

BLOCK = 16


class PrefixIndex:
    """Which replicas were sent which block-aligned prefixes, and when last."""

    def __init__(self) -> None:
        self._seen: dict[int, dict[int, int]] = {}  # prefix hash -> replica -> last use
        self._clock = 0

    @staticmethod
    def _hashes(tokens: np.ndarray) -> list[int]:
        n = len(tokens) // BLOCK
        if n == 0:
            return []
        blocks = tokens[: n * BLOCK].reshape(n, BLOCK)
        out, h = [], 0
        for row in blocks:
            h = hash((h, row.tobytes()))
            out.append(h)
        return out

    def match(self, tokens: np.ndarray) -> tuple[int, int | None]:
        """(tokens matched, the replica that last used the longest match)."""
        best, owner = 0, None
        for i, h in enumerate(self._hashes(tokens)):
            users = self._seen.get(h)
            if not users:
                break
            best, owner = (i + 1) * BLOCK, max(users, key=users.__getitem__)
        return best, owner

    def insert(self, tokens: np.ndarray, replica: int) -> None:
        self._clock += 1
        for h in self._hashes(tokens):
            self._seen.setdefault(h, {})[replica] = self._clock


@dataclass(frozen=True)
class CacheAwareConfig:
    """The gateway's defaults (``--cache-threshold``, ``--balance-abs-threshold``,
    ``--balance-rel-threshold``)."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5


class Policy:
    name = "policy"

    def pick(self, tokens: np.ndarray, in_flight: list[int]) -> int:
        raise NotImplementedError


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, tokens: np.ndarray, in_flight: list[int]) -> int:
        chosen = self._next % len(in_flight)
        self._next += 1
        return chosen


class PowerOfTwo(Policy):
    name = "power_of_two"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def pick(self, tokens: np.ndarray, in_flight: list[int]) -> int:
        if len(in_flight) == 1:
            return 0
        a, b = self._rng.sample(range(len(in_flight)), 2)
        return a if in_flight[a] <= in_flight[b] else b


class CacheAware(Policy):
    name = "cache_aware"

    def __init__(self, config: CacheAwareConfig | None = None) -> None:
        self.config = config or CacheAwareConfig()
        self.index = PrefixIndex()

    def pick(self, tokens: np.ndarray, in_flight: list[int]) -> int:
        c = self.config
        low, high = min(in_flight), max(in_flight)
        least = in_flight.index(low)
        if high - low > c.balance_abs_threshold and high > low * c.balance_rel_threshold:
            chosen = least
        else:
            matched, owner = self.index.match(tokens)
            chosen = owner if owner is not None and matched / max(1, len(tokens)) > c.cache_threshold else least
        self.index.insert(tokens, chosen)
        return chosen
