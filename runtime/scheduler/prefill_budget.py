"""What one prefill step may still take (mini-sglang's ``PrefillAdder``): the scheduler asks
it, request by request, whether and how much of a prompt fits.

Three limits: prompt tokens (``--chunked-prefill-size``, less the running requests' decode
tokens when they ride along in a mixed step; while requests decode, also no more than the
step computes in ``--max-decode-stall-ms`` at the prefill rate measured so far), request rows
(``--max-running-requests``), and KV slots: after the step, the pool must still hold a reserve
for the tokens the running and newly admitted requests may yet decode (each counts
``min(max_new_tokens, cap)`` times the scheduler's new-token ratio, which retractions raise).
"""

from __future__ import annotations

from dataclasses import dataclass

RESERVE_CAP_PER_REQ = 4096  # most decode tokens one request adds to the reserve
# Fewest prompt tokens a step capped by time still takes: thinner, its matrix products would
# cost about as much per step for less work, and a short prompt would be cut in pieces.
MIN_TIMED_TOKENS = 64


@dataclass
class PrefillRate:
    """Tokens a prefill step computes per second, an exponential average over the recent
    steps of ``MIN_TIMED_TOKENS`` tokens or more (the running requests' tokens mixed in count:
    they take the step's time too). It follows what the step costs now: the machine, the
    dtype, how long the prefixes attended to are."""

    tokens_per_s: float = 0.0  # 0: nothing measured yet
    weight: float = 0.25  # of the newest step

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens < MIN_TIMED_TOKENS or seconds <= 0:
            return
        rate = num_tokens / seconds
        self.tokens_per_s = rate if not self.tokens_per_s else self.tokens_per_s + self.weight * (rate - self.tokens_per_s)

    def tokens_within(self, seconds: float) -> int | None:
        """The tokens a step computes in about ``seconds`` (at least ``MIN_TIMED_TOKENS``);
        None before any step was measured."""
        if not self.tokens_per_s:
            return None
        return max(MIN_TIMED_TOKENS, int(self.tokens_per_s * seconds))


@dataclass
class PrefillBudget:
    tokens: int  # prompt tokens this step may still compute
    rows: int  # requests that may still join the running ones
    reserve: float  # KV slots to leave free for future decode tokens

    @classmethod
    def for_step(cls, chunked_prefill_size: int, max_running: int, num_running: int, mixed: bool,
                 reserve: float, timed: int | None = None) -> PrefillBudget:
        """``timed``: the tokens a step computes in the time it may hold running requests
        (``PrefillRate.tokens_within``); None for no such limit."""
        tokens = chunked_prefill_size if chunked_prefill_size > 0 else 1 << 62
        decodes = num_running if mixed else 0  # the running requests' tokens count too
        tokens = max(tokens - decodes, 1)
        if timed is not None and num_running:  # and prompts not thinned past MIN_TIMED_TOKENS
            tokens = min(tokens, max(timed - decodes, MIN_TIMED_TOKENS))
        return cls(tokens, max_running - num_running, reserve)

    @property
    def exhausted(self) -> bool:
        return self.exhausted_tokens or self.rows <= 0

    @property
    def exhausted_tokens(self) -> bool:
        return self.tokens <= 0

    def chunk(self, need: int) -> int:
        """How many of ``need`` prompt tokens fit this step."""
        return min(need, self.tokens)

    def leaves_reserve(self, free_slots: int, n: int) -> bool:
        """Whether taking ``n`` more slots out of ``free_slots`` keeps the reserve free."""
        return free_slots >= n + self.reserve

    def take(self, n: int, decode_tokens: float = 0.0) -> None:
        """A request joins with ``n`` prompt tokens; a newly admitted one also adds
        ``decode_tokens`` (its expected future decode tokens) to the reserve."""
        self.tokens -= n
        self.rows -= 1
        self.reserve += decode_tokens

    @staticmethod
    def expected_decode_tokens(max_new_tokens: int, new_token_ratio: float) -> float:
        return min(max_new_tokens, RESERVE_CAP_PER_REQ) * new_token_ratio
