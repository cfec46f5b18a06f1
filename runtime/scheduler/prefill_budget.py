"""What one prefill step may still take (mini-sglang's ``PrefillAdder``): the scheduler asks
it, request by request, whether and how much of a prompt fits.

Three limits: prompt tokens (``--chunked-prefill-size``, less the running requests' decode
tokens when they ride along in a mixed step), request rows (``--max-running-requests``), and
KV slots: after the step, the pool must still hold a reserve for the tokens the running and
newly admitted requests may yet decode (each counts ``min(max_new_tokens, cap)`` times the
scheduler's new-token ratio, which retractions raise).
"""

from __future__ import annotations

from dataclasses import dataclass

RESERVE_CAP_PER_REQ = 4096  # most decode tokens one request adds to the reserve


@dataclass
class PrefillBudget:
    tokens: int  # prompt tokens this step may still compute
    rows: int  # requests that may still join the running ones
    reserve: float  # KV slots to leave free for future decode tokens

    @classmethod
    def for_step(cls, chunked_prefill_size: int, max_running: int, num_running: int, mixed: bool,
                 reserve: float) -> PrefillBudget:
        tokens = chunked_prefill_size if chunked_prefill_size > 0 else 1 << 62
        if mixed:  # the running requests' tokens count against the step's budget too
            tokens = max(tokens - num_running, 1)
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
