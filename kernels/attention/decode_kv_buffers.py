"""Dense copies of the running requests' K/V, kept from one decode step to the next.

``torch_native`` attends over a padded dense copy of each request's K/V, gathered from the
paged pool. Between two decode steps over the same requests, each request gains exactly one
token, so gathering every token again, every layer, every step (most of a decode step at
large batches) is wasted work: these buffers keep the copy and append the new token.

A buffer is trusted only if it was written at the previous step: any other step (a prefill,
a request joining, finishing or being retracted, a forward that failed half-way) leads to
a full gather from the pool, so the pool stays the one source of truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Room for this many more tokens per request before the buffers must be rebuilt larger.
HEADROOM = 64
# At most this many bytes of buffers (they duplicate the running requests' K/V); beyond it
# decode steps gather from the pool every layer as before.
BUDGET_BYTES = 2 << 30


@dataclass
class DecodeKVBuffers:
    rows: list[int]  # the batch's request rows, in batch order
    seq_lens: list[int]  # tokens each request attends to at the current step
    capacity: list[int]  # per length group: tokens a buffer holds per request
    step: int = 0
    # [layer][group] -> ([kv_heads, n, capacity, dim] keys, values, the step they hold)
    buffers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, int]] = field(default_factory=dict)

    def follows(self, rows: list[int], seq_lens: list[int]) -> bool:
        """Whether a decode step over ``rows`` with ``seq_lens`` is the next step of this one
        and every request still fits its buffer."""
        return (
            rows == self.rows
            and all(s == p + 1 for s, p in zip(seq_lens, self.seq_lens, strict=True))
            and max(seq_lens) <= min(self.capacity)
        )

    def advance(self, seq_lens: list[int]) -> None:
        self.seq_lens = seq_lens
        self.step += 1

    def get(self, layer: int, group: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The buffers of (``layer``, ``group``) if they hold every token up to the previous step."""
        entry = self.buffers.get((layer, group))
        if entry is None or entry[2] != self.step - 1:
            return None
        return entry[0], entry[1]

    def put(self, layer: int, group: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.buffers[(layer, group)] = (keys, values, self.step)


def buffer_bytes(num_layers: int, sizes: list[tuple[int, int]], kv_heads: int, dim: int, dtype: torch.dtype) -> int:
    """Bytes of K and V buffers for groups of ``(requests, capacity)``."""
    tokens = sum(n * cap for n, cap in sizes)
    return 2 * num_layers * kv_heads * tokens * dim * torch.finfo(dtype).bits // 8
