"""Where a request's KV slots come from and where they go: the glue between requests, the
radix cache, the slot allocator and the request-to-token table.

Life of a request's slots:
  1. ``admit``: match the longest cached prefix, lock it, take a table row, write the
     prefix's slots into the row (``cache_protected_len = prefix_len``).
  2. ``grant``: new slots for the tokens computed this step (evicting LRU cache first).
  3. ``cache_unfinished`` after a prefill chunk: hand computed tokens to the tree, adopt
     the tree's canonical slots, move the lock down.
  4. ``release`` when finished or retracted: hand everything computed to the tree, free
     duplicates and ungranted leftovers, unlock, give the row back.
"""

from __future__ import annotations

import torch

from radix_cache import RadixCache, ReqToTokenTable, SlotAllocator
from runtime.scheduler.req import Req


class CacheManager:
    def __init__(self, tree: RadixCache, allocator: SlotAllocator, table: ReqToTokenTable) -> None:
        self.tree = tree
        self.allocator = allocator
        self.table = table

    @property
    def free_slots(self) -> int:
        """Slots obtainable now without touching running requests."""
        return self.allocator.available + self.tree.evictable_size

    def match_len(self, req: Req) -> int:
        ids = req.fill_ids[: req.max_reusable_prefix]
        return self.tree.match_prefix(ids, req.options.namespace).prefix_len

    def admit(self, req: Req) -> bool:
        """Give ``req`` a row and its cached prefix. False (nothing changed) if no row is free."""
        row = self.table.alloc()
        if row is None:
            return False
        match = self.tree.match_prefix(req.fill_ids[: req.max_reusable_prefix], req.options.namespace)
        self.tree.inc_lock_ref(match.last_node)
        prefix_len = match.prefix_len
        self.table.write(row, 0, match.indices)
        req.row, req.last_node = row, match.last_node
        req.cache_protected_len = req.kv_len = req.alloc_len = prefix_len
        if not req.is_retracted:
            req.cached_tokens = prefix_len
        return True

    def grant(self, req: Req, n: int) -> bool:
        """Give ``req`` ``n`` new slots at positions ``alloc_len ..``; False if memory is short."""
        slots = self.alloc(n)
        if slots is None:
            return False
        assert req.row is not None
        self.table.write(req.row, req.alloc_len, slots)
        req.alloc_len += n
        return True

    def grant_one_each(self, reqs: list[Req]) -> torch.Tensor | None:
        """One new slot per request (a decode step), and one more per token of its draft
        (``req.draft``), in one allocation; returns the slots in ``reqs`` order, or None
        (nothing changed) if memory is short."""
        counts = [1 + len(r.draft) for r in reqs]
        slots = self.alloc(sum(counts))
        if slots is None:
            return None
        rows = torch.tensor([r.row for r in reqs], dtype=torch.int64)
        if len(slots) == len(reqs):
            positions = torch.tensor([r.alloc_len for r in reqs], dtype=torch.int64)
        else:
            rows = rows.repeat_interleave(torch.tensor(counts))
            positions = torch.cat([torch.arange(r.alloc_len, r.alloc_len + n) for r, n in zip(reqs, counts, strict=True)])
        self.table.table[rows, positions] = slots.to(self.table.table.device)
        for r, n in zip(reqs, counts, strict=True):
            r.alloc_len += n
        return slots

    def take_back_unused(self, req: Req) -> None:
        """Free the slots granted past ``req.kv_len`` (a draft's rejected tokens)."""
        assert req.row is not None
        if req.alloc_len > req.kv_len:
            self.allocator.free(self.table.read(req.row, req.alloc_len, req.kv_len))
            req.alloc_len = req.kv_len

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self.allocator.available:
            self.tree.evict(n - self.allocator.available)
        return self.allocator.alloc(n)

    def cache_unfinished(self, req: Req) -> None:
        """Share the prompt tokens computed so far while the request keeps running."""
        if self.tree.disable:
            return  # nothing to share; the request keeps owning its slots
        self._insert_computed(req)
        match = self.tree.match_prefix(req.fill_ids[: req.kv_len], req.options.namespace)
        assert req.row is not None
        self.table.write(req.row, 0, match.indices)
        self.tree.inc_lock_ref(match.last_node)
        self.tree.dec_lock_ref(req.last_node)  # type: ignore[arg-type]
        # An unaligned tail (page_size > 1) stays ours, still in the row after the prefix.
        req.last_node, req.cache_protected_len = match.last_node, match.prefix_len

    def release(self, req: Req) -> None:
        """Hand the request's computed tokens to the tree and free everything else it holds."""
        assert req.row is not None and req.last_node is not None
        self._insert_computed(req)
        slots = self.table.read(req.row, req.alloc_len)
        keep_end = max(self.tree.aligned_len(req.kv_len), req.cache_protected_len)
        self.allocator.free(slots[keep_end:])  # unaligned tail and slots granted but not computed
        self.tree.dec_lock_ref(req.last_node)
        self.table.free(req.row)
        req.row, req.last_node = None, None
        req.cache_protected_len = req.kv_len = req.alloc_len = 0

    def _insert_computed(self, req: Req) -> None:
        """Insert ``fill_ids[:kv_len]`` into the tree and free our duplicates of what it
        already had. The tree now owns the aligned computed part (or, when disabled, has
        freed it)."""
        assert req.row is not None
        slots = self.table.read(req.row, req.kv_len)
        already = self.tree.insert(req.fill_ids[: req.kv_len], slots, req.options.namespace)
        if already > req.cache_protected_len:
            self.allocator.free(slots[req.cache_protected_len : already])
