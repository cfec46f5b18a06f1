"""The free list of KV slots.

A *slot* is one row of every layer's K/V tensors: the storage for one token. The allocator
only hands out integers; the worker owns the tensors they index.

Slot 0 is reserved as a dummy slot (padding in batched kernels writes there), so an
allocator built with ``num_slots`` rows can hand out ``num_slots - 1`` of them.
"""

from __future__ import annotations

from collections import deque

import torch

from radix_cache.validation import as_index_tensor


class SlotAllocator:
    """Hands out and takes back KV slot indices in ``[1, num_slots)``.

    Rules:
      - ``alloc(n)`` returns exactly ``n`` distinct free slots (int64 tensor), or ``None`` when
        fewer than ``n`` are free; it never evicts anything itself (the caller asks the cache).
      - ``free(indices)`` takes back slots that were handed out. Freeing slot 0, a slot out of
        range, a slot that is already free, or the same slot twice in one call raises
        ``ValueError`` and changes nothing.
      - ``available + (slots held by others) == capacity`` at all times.
    """

    def __init__(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or num_slots < 2:
            raise ValueError(f"num_slots must be an integer >= 2 (slot 0 is reserved), got {num_slots!r}")
        self.num_slots = num_slots
        self._is_free = torch.ones(num_slots, dtype=torch.bool)
        self._is_free[0] = False
        # Free slots as a queue of chunks: a free appends its slots as one chunk, an alloc takes
        # from the front (never-used slots first, in order, then freed ones in the order they
        # were freed) and copies only what it hands out. (Merging all chunks on the first
        # alloc after a free copied the whole free list, ~46k slots for the default pool: ~1%
        # of a busy scheduler's time.) The order is the one the merged list gave: handing out
        # the most recently freed slots first instead made float32 runs that must agree to the
        # bit (tests/test_cpu_decoder_layers.py, forks) differ in logprobs' last digits.
        self._free_chunks: deque[torch.Tensor] = deque([torch.arange(1, num_slots, dtype=torch.int64)])
        self._available = num_slots - 1

    @property
    def capacity(self) -> int:
        """Slots that can ever be handed out (all but the reserved slot 0)."""
        return self.num_slots - 1

    @property
    def available(self) -> int:
        return self._available

    def alloc(self, n: int) -> torch.Tensor | None:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"alloc size must be a non-negative integer, got {n!r}")
        if n > self._available:
            return None
        taken: list[torch.Tensor] = []
        need = n
        while need > 0:
            head = self._free_chunks[0]
            if head.numel() <= need:
                taken.append(self._free_chunks.popleft())
                need -= head.numel()
            else:
                taken.append(head[:need])
                self._free_chunks[0] = head[need:]
                need = 0
        out = taken[0] if len(taken) == 1 else torch.cat(taken) if taken else torch.empty(0, dtype=torch.int64)
        self._is_free[out] = False
        self._available -= n
        return out

    def free(self, indices: object) -> None:
        idx = as_index_tensor(indices, "indices")
        if idx.numel() == 0:
            return
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 1 or hi >= self.num_slots:
            raise ValueError(
                f"cannot free slot {lo if lo < 1 else hi}: valid slots are 1..{self.num_slots - 1} "
                "(slot 0 is the reserved padding slot)"
            )
        if bool(self._is_free[idx].any()):
            bad = int(idx[self._is_free[idx]][0])
            raise ValueError(f"double free of KV slot {bad}")
        # Duplicates within the call: after marking, the free count must grow by exactly
        # len(idx). (A vectorised sum is far cheaper than sorting idx with torch.unique.)
        self._is_free[idx] = True
        if int(self._is_free.sum()) != self._available + idx.numel():
            self._is_free[idx] = False  # all were in use before this call
            raise ValueError("the same KV slot appears twice in one free() call")
        self._free_chunks.append(idx.clone())
        self._available += idx.numel()

    def is_free(self, indices: torch.Tensor) -> torch.Tensor:
        """Boolean mask: which of ``indices`` are currently free."""
        return self._is_free[indices]

    def reset(self) -> None:
        """Forget every allocation: all slots become free again."""
        self.__init__(self.num_slots)  # type: ignore[misc]
