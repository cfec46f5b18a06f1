"""Unit tests for radix_cache: SlotAllocator, ReqToTokenTable and RadixCache.

Every test that builds a cache goes through the ``make`` fixture, which runs
``check_invariants`` (with the slots the test still holds) when the test ends.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radix_cache import RadixCache, ReqToTokenTable, SlotAllocator


def as_list(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.tolist()]


class Harness:
    """A cache, its allocator, and the count of slots the test holds outside the tree."""

    def __init__(self, num_slots: int = 64, page_size: int = 1, disable: bool = False) -> None:
        self.allocator = SlotAllocator(num_slots)
        self.cache = RadixCache(self.allocator, page_size=page_size, disable=disable)
        self.held = 0

    def take(self, n: int) -> torch.Tensor:
        slots = self.allocator.alloc(n)
        assert slots is not None, f"test pool too small for {n} slots"
        self.held += n
        return slots

    def give_back(self, slots: torch.Tensor) -> None:
        self.allocator.free(slots)
        self.held -= slots.numel()

    def insert(self, tokens, namespace=None) -> tuple[int, torch.Tensor]:
        """Insert ``tokens`` with fresh slots, as a request finishing would; return
        (already cached length, the slots handed in)."""
        slots = self.take(len(tokens))
        p = self.cache.insert(tokens, slots, namespace=namespace)
        a = self.cache.aligned_len(len(tokens))
        if self.cache.disable:
            assert p == 0
            self.held -= a  # the cache freed slots[:a] itself
            self.give_back(slots[a:])
        else:
            self.held -= a - p  # the tree owns slots[p:a]
            self.give_back(torch.cat([slots[:p], slots[a:]]))
        return p, slots

    def check(self) -> None:
        self.cache.check_invariants(num_held_outside=self.held)


@pytest.fixture
def make():
    made: list[Harness] = []

    def factory(**kwargs) -> Harness:
        h = Harness(**kwargs)
        made.append(h)
        return h

    yield factory
    for h in made:
        h.check()


# ====================================================================== SlotAllocator
class TestSlotAllocator:
    def test_capacity_and_slot_zero_never_handed_out(self):
        a = SlotAllocator(10)
        assert a.capacity == 9 and a.available == 9
        got = a.alloc(9)
        assert sorted(as_list(got)) == list(range(1, 10))
        assert a.available == 0
        assert a.alloc(1) is None
        assert not bool(a.is_free(got).any())

    def test_alloc_returns_none_when_short_and_changes_nothing(self):
        a = SlotAllocator(8)
        first = a.alloc(5)
        assert a.alloc(3) is None
        assert a.available == 2
        rest = a.alloc(2)
        assert len(set(as_list(first)) | set(as_list(rest))) == 7

    def test_alloc_zero_and_bad_sizes(self):
        a = SlotAllocator(4)
        assert a.alloc(0).numel() == 0 and a.available == 3
        for bad in (-1, 1.0, "2", None):
            with pytest.raises(ValueError, match="alloc size"):
                a.alloc(bad)
        assert a.available == 3

    def test_free_restores_and_reuses(self):
        a = SlotAllocator(6)
        s = a.alloc(5)
        a.free(s[:2])
        assert a.available == 2
        a.free([int(x) for x in s[2:4]])  # a plain list works too
        a.free(np.array([int(s[4])]))  # and a numpy array
        assert a.available == 5
        again = a.alloc(5)
        assert sorted(as_list(again)) == [1, 2, 3, 4, 5]

    def test_free_empty_is_noop(self):
        a = SlotAllocator(4)
        a.free(torch.empty(0, dtype=torch.int64))
        a.free([])
        assert a.available == 3

    @pytest.mark.parametrize(
        "bad, message",
        [
            ([0], "slot 0"),  # the reserved slot
            ([10], "cannot free slot 10"),  # out of range
            ([-3], "cannot free slot -3"),
            ([2, 2], "twice in one free"),  # duplicate in one call
            ([3, 9], "double free of KV slot 9"),  # 9 was never handed out
            ([3, 0], "slot 0"),  # one bad slot spoils the whole call
        ],
    )
    def test_bad_free_raises_and_changes_nothing(self, bad, message):
        a = SlotAllocator(10)
        held = a.alloc(5)  # slots 1..5 held, 6..9 free
        assert sorted(as_list(held)) == [1, 2, 3, 4, 5]
        before_free = a._is_free.clone()
        with pytest.raises(ValueError, match=message):
            a.free(bad)
        assert a.available == 4
        assert torch.equal(a._is_free, before_free)
        a.free(held)  # still a clean state
        assert a.available == 9

    def test_double_free_across_calls(self):
        a = SlotAllocator(5)
        s = a.alloc(2)
        a.free(s)
        with pytest.raises(ValueError, match="double free"):
            a.free(s[:1])
        assert a.available == 4

    @pytest.mark.parametrize(
        "bad", [[1.0], np.array([1.5]), torch.tensor([1.0]), [[1, 2]], "12", ["a"], [None]]
    )
    def test_free_bad_types(self, bad):
        a = SlotAllocator(5)
        a.alloc(2)
        with pytest.raises(ValueError, match="indices"):
            a.free(bad)
        assert a.available == 2

    @pytest.mark.parametrize("bad", [0, 1, 2.0, "8"])
    def test_bad_num_slots(self, bad):
        with pytest.raises(ValueError, match="num_slots"):
            SlotAllocator(bad)

    def test_many_small_frees_then_alloc(self):
        a = SlotAllocator(101)
        s = a.alloc(100)
        for i in range(0, 100, 3):
            a.free(s[i : i + 3])
        assert a.available == 100
        assert sorted(as_list(a.alloc(100))) == list(range(1, 101))

    def test_reset(self):
        a = SlotAllocator(5)
        a.alloc(3)
        a.reset()
        assert a.available == 4


# ====================================================================== ReqToTokenTable
class TestReqToTokenTable:
    def test_alloc_until_full_then_reuse(self):
        t = ReqToTokenTable(3, 8)
        rows = [t.alloc() for _ in range(3)]
        assert sorted(rows) == [0, 1, 2]
        assert t.alloc() is None and t.available == 0
        t.free(rows[1])
        assert t.available == 1
        assert t.alloc() == rows[1]

    def test_free_unused_row_raises(self):
        t = ReqToTokenTable(3, 8)
        r = t.alloc()
        unused = next(i for i in range(3) if i != r)
        for bad in (unused, -1, 3):
            with pytest.raises(ValueError, match="not in use"):
                t.free(bad)
        assert t.available == 2
        t.free(r)
        with pytest.raises(ValueError, match="not in use"):  # freed twice
            t.free(r)
        assert t.available == 3

    def test_write_read(self):
        t = ReqToTokenTable(2, 6)
        r = t.alloc()
        t.write(r, 2, torch.tensor([7, 8, 9]))
        assert as_list(t.read(r, 5, start=2)) == [7, 8, 9]
        with pytest.raises(ValueError, match="max_context_len"):
            t.write(r, 4, torch.tensor([1, 2, 3]))

    @pytest.mark.parametrize("args", [(0, 4), (4, 0), (1.5, 4), (2, "4")])
    def test_bad_sizes(self, args):
        with pytest.raises(ValueError, match="must be a positive integer"):
            ReqToTokenTable(*args)

    def test_reset(self):
        t = ReqToTokenTable(2, 4)
        t.alloc()
        t.alloc()
        t.reset()
        assert t.available == 2


# ====================================================================== RadixCache: insert/match
def test_first_insert_returns_zero_and_match_returns_slots(make):
    h = make()
    p, slots = h.insert([5, 6, 7, 8])
    assert p == 0
    assert h.cache.total_size == h.cache.evictable_size == 4 and h.cache.protected_size == 0
    m = h.cache.match_prefix([5, 6, 7, 8])
    assert as_list(m.indices) == as_list(slots) and m.prefix_len == 4
    assert m.indices.dtype == torch.int64
    h.check()


def test_accepts_lists_tuples_numpy_and_tensors(make):
    h = make()
    slots = h.take(3)
    assert h.cache.insert(np.array([1, 2, 3], dtype=np.int32), slots.to(torch.int32)) == 0
    h.held -= 3
    mixed = [np.int64(1), np.int32(2), 3]
    for q in (
        [1, 2, 3],
        (1, 2, 3),
        np.array([1, 2, 3]),
        torch.tensor([1, 2, 3]),
        range(1, 4),
        mixed,
    ):
        assert as_list(h.cache.match_prefix(q).indices) == as_list(slots)


def test_insert_extension_returns_shared_length(make):
    h = make()
    _, s1 = h.insert([1, 2, 3])
    p, s2 = h.insert([1, 2, 3, 4, 5])
    assert p == 3
    assert h.cache.total_size == 5
    m = h.cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert as_list(m.indices) == as_list(s1) + as_list(s2[3:])
    # Re-inserting a cached sequence takes nothing.
    p, _ = h.insert([1, 2, 3, 4])
    assert p == 4 and h.cache.total_size == 5


def test_insert_with_the_trees_own_slots(make):
    """The scheduler's pattern: matched slots + new slots; the caller frees only the
    duplicates between the match length and the returned length."""
    h = make()
    h.insert([1, 2, 3, 4])
    m = h.cache.match_prefix([1, 2, 9, 9, 9])
    h.cache.inc_lock_ref(m.last_node)
    new = h.take(3)
    full = torch.cat([m.indices, new])
    p = h.cache.insert([1, 2, 9, 9, 9], full)
    assert p == m.prefix_len == 2
    h.held -= 3
    h.cache.dec_lock_ref(m.last_node)
    assert as_list(h.cache.match_prefix([1, 2, 9, 9, 9]).indices) == as_list(full)
    assert h.cache.total_size == 7


def test_insert_does_not_alias_callers_tensor(make):
    h = make()
    slots = h.take(3)
    original = as_list(slots)
    h.cache.insert([1, 2, 3], slots)
    h.held -= 3
    slots[:] = 0
    assert as_list(h.cache.match_prefix([1, 2, 3]).indices) == original
    m = h.cache.match_prefix([1, 2, 3])
    m.indices[:] = 0  # nor does a match result alias the tree
    assert as_list(h.cache.match_prefix([1, 2, 3]).indices) == original


def test_split_in_the_middle_of_a_node(make):
    h = make()
    _, s1 = h.insert([1, 2, 3, 4, 5])
    p, s2 = h.insert([1, 2, 3, 8, 9])
    assert p == 3
    assert h.cache.total_size == 7
    mid = h.cache.match_prefix([1, 2, 3]).last_node
    assert len(mid) == 3 and len(mid.children) == 2 and mid.parent.is_root
    left = h.cache.match_prefix([1, 2, 3, 4, 5])
    right = h.cache.match_prefix([1, 2, 3, 8, 9])
    assert left.last_node.parent is mid and right.last_node.parent is mid
    assert len(left.last_node) == 2 and len(right.last_node) == 2
    assert as_list(left.indices) == as_list(s1)
    assert as_list(right.indices) == as_list(s1[:3]) + as_list(s2[3:])
    # A different first token is a sibling of mid under the root.
    p, _ = h.insert([7, 2, 3])
    assert p == 0 and h.cache.total_size == 10


def test_match_ending_inside_a_node_returns_and_locks_exactly_that_prefix(make):
    h = make()
    _, slots = h.insert([1, 2, 3, 4, 5, 6])
    m = h.cache.match_prefix([1, 2, 3, 7, 7])
    assert as_list(m.indices) == as_list(slots[:3])
    assert len(m.last_node) == 3
    # The split changes no sizes.
    assert h.cache.total_size == h.cache.evictable_size == 6
    h.cache.inc_lock_ref(m.last_node)
    assert h.cache.protected_size == 3 and h.cache.evictable_size == 3
    h.check()
    assert h.cache.evict(100) == 3  # only the unlocked tail [4 5 6] can go
    assert as_list(h.cache.match_prefix([1, 2, 3, 4, 5, 6]).indices) == as_list(slots[:3])
    h.cache.dec_lock_ref(m.last_node)
    assert h.cache.protected_size == 0 and h.cache.evictable_size == 3


def test_match_query_shorter_longer_and_empty(make):
    h = make()
    _, slots = h.insert([1, 2, 3])
    assert as_list(h.cache.match_prefix([1, 2, 3, 4, 5]).indices) == as_list(slots)
    assert as_list(h.cache.match_prefix([1, 2]).indices) == as_list(slots[:2])
    assert h.cache.match_prefix([9, 1, 2]).prefix_len == 0
    m = h.cache.match_prefix([])
    assert m.prefix_len == 0 and m.last_node.is_root
    h.cache.inc_lock_ref(m.last_node)  # locking the root is a no-op
    h.cache.dec_lock_ref(m.last_node)
    assert h.cache.protected_size == 0


def test_match_never_changes_sizes_or_allocator(make):
    h = make()
    h.insert([1, 2, 3, 4])
    h.insert([1, 2, 5, 6])
    before = (h.cache.evictable_size, h.cache.protected_size, h.allocator.available)
    for q in ([1], [1, 2, 3], [1, 2, 5], [1, 2, 3, 4, 5], [2]):
        h.cache.match_prefix(q)
        h.check()
    assert (h.cache.evictable_size, h.cache.protected_size, h.allocator.available) == before


# ====================================================================== page_size > 1
@pytest.mark.parametrize("page_size", [2, 4])
def test_paged_inserts_and_matches_are_whole_pages(make, page_size):
    h = make(page_size=page_size)
    toks = list(range(10, 10 + 2 * page_size + 1))  # two pages and one extra token
    p, slots = h.insert(toks)
    assert p == 0
    assert h.cache.total_size == 2 * page_size  # the unaligned tail was not inserted
    m = h.cache.match_prefix(toks)
    assert as_list(m.indices) == as_list(slots[: 2 * page_size])
    # A query that leaves the cache in the middle of the second page matches one page.
    q = toks[: page_size + 1] + [999] * page_size
    m = h.cache.match_prefix(q)
    assert as_list(m.indices) == as_list(slots[:page_size])
    assert len(m.last_node) == page_size
    # Shorter than one page: nothing.
    assert h.cache.match_prefix(toks[: page_size - 1]).prefix_len == 0
    for q in ([], toks[:3], toks, toks + [1, 2, 3]):
        assert h.cache.match_prefix(q).prefix_len % page_size == 0


def test_paged_insert_diverging_inside_a_page_shares_only_whole_pages(make):
    h = make(page_size=2)
    _, s1 = h.insert([1, 2, 3, 4])
    p, s2 = h.insert([1, 2, 3, 5])
    assert p == 2  # [3 4] and [3 5] differ inside the second page
    assert h.cache.total_size == 6
    mid = h.cache.match_prefix([1, 2, 3]).last_node
    assert len(mid) == 2 and len(mid.children) == 2
    assert as_list(h.cache.match_prefix([1, 2, 3, 5]).indices) == as_list(s1[:2]) + as_list(s2[2:])
    p, _ = h.insert([1, 3, 3, 4])  # differs inside the first page: nothing shared
    assert p == 0 and h.cache.total_size == 10


def test_paged_insert_shorter_than_a_page(make):
    h = make(page_size=4)
    p, _ = h.insert([1, 2, 3])
    assert p == 0 and h.cache.total_size == 0
    assert h.allocator.available == h.allocator.capacity


# ====================================================================== namespaces
def test_namespaces_are_isolated(make):
    h = make()
    _, sa = h.insert([1, 2, 3], namespace="tenant-a")
    assert h.cache.match_prefix([1, 2, 3], namespace="tenant-b").prefix_len == 0
    assert h.cache.match_prefix([1, 2, 3]).prefix_len == 0  # the default namespace too
    p, sb = h.insert([1, 2, 3], namespace="tenant-b")
    assert p == 0
    assert not set(as_list(sa)) & set(as_list(sb))
    assert as_list(h.cache.match_prefix([1, 2, 3], namespace="tenant-a").indices) == as_list(sa)
    assert as_list(h.cache.match_prefix([1, 2, 3], namespace="tenant-b").indices) == as_list(sb)
    assert h.cache.total_size == 6
    assert h.cache.evict(6) == 6
    assert h.cache.total_size == 0


def test_lock_in_one_namespace_does_not_protect_the_other(make):
    h = make()
    h.insert([1, 2], namespace=("lora", 1))
    h.insert([1, 2], namespace=("lora", 2))
    m = h.cache.match_prefix([1, 2], namespace=("lora", 1))
    h.cache.inc_lock_ref(m.last_node)
    assert h.cache.evict(10) == 2
    assert h.cache.match_prefix([1, 2], namespace=("lora", 2)).prefix_len == 0
    assert h.cache.match_prefix([1, 2], namespace=("lora", 1)).prefix_len == 2
    h.cache.dec_lock_ref(m.last_node)


# ====================================================================== locks
def test_lock_accounting_moves_exactly_the_path(make):
    h = make()
    h.insert([1, 2])
    h.insert([1, 2, 3, 4, 5])
    h.insert([1, 2, 3, 4, 5, 6, 7, 8, 9])  # path: [1 2] -> [3 4 5] -> [6 7 8 9]
    h.insert([7, 7, 7])  # an unrelated branch
    deep = h.cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9]).last_node
    middle = h.cache.match_prefix([1, 2, 3, 4, 5]).last_node
    assert (len(deep), len(middle)) == (4, 3)
    total = h.cache.total_size
    assert total == 12

    h.cache.inc_lock_ref(deep)
    assert h.cache.protected_size == 9 and h.cache.evictable_size == 3
    h.check()
    h.cache.inc_lock_ref(middle)  # already protected: no move
    assert h.cache.protected_size == 9
    h.cache.inc_lock_ref(deep)  # a second lock on the same node: no move
    assert h.cache.protected_size == 9
    h.cache.dec_lock_ref(deep)
    assert h.cache.protected_size == 9
    h.cache.dec_lock_ref(deep)  # the middle lock still protects [1 2] [3 4 5]
    assert h.cache.protected_size == 5 and h.cache.evictable_size == 7
    h.check()
    h.cache.dec_lock_ref(middle)
    assert h.cache.protected_size == 0 and h.cache.evictable_size == total


def test_lock_survives_a_later_split_of_the_locked_node(make):
    h = make()
    h.insert([1, 2, 3, 4])
    node = h.cache.match_prefix([1, 2, 3, 4]).last_node
    h.cache.inc_lock_ref(node)
    h.insert([1, 2, 9])  # splits the locked node into [1 2] -> [3 4]
    assert h.cache.protected_size == 4 and h.cache.evictable_size == 1
    h.check()
    assert h.cache.evict(10) == 1
    h.cache.dec_lock_ref(node)
    assert h.cache.protected_size == 0 and h.cache.evictable_size == 4


def test_dec_lock_ref_of_unlocked_raises_and_changes_nothing(make):
    h = make()
    h.insert([1, 2, 3])
    node = h.cache.match_prefix([1, 2, 3]).last_node
    with pytest.raises(RuntimeError, match="unlocked"):
        h.cache.dec_lock_ref(node)
    assert node.lock_ref == 0 and h.cache.evictable_size == 3
    h.cache.inc_lock_ref(node)
    h.cache.dec_lock_ref(node)
    with pytest.raises(RuntimeError, match="unlocked"):
        h.cache.dec_lock_ref(node)
    assert h.cache.evictable_size == 3 and h.cache.protected_size == 0


# ====================================================================== eviction
def test_evicts_least_recently_used_leaf_first(make):
    h = make()
    h.insert([1, 1])
    h.insert([2, 2])
    h.insert([3, 3])
    h.cache.match_prefix([1, 1])  # refresh: now [2 2] is the oldest
    assert h.cache.evict(1) == 2
    assert h.cache.match_prefix([2, 2]).prefix_len == 0
    assert h.cache.match_prefix([1, 1]).prefix_len == 2  # refreshes [1 1] again
    assert h.cache.evict(1) == 2
    assert h.cache.match_prefix([3, 3]).prefix_len == 0
    assert h.cache.match_prefix([1, 1]).prefix_len == 2


def test_insert_refreshes_recency(make):
    h = make()
    h.insert([1, 1])
    h.insert([2, 2])
    h.insert([1, 1])  # re-insert counts as a use
    assert h.cache.evict(1) == 2
    assert h.cache.match_prefix([1, 1]).prefix_len == 2


def test_partial_match_does_not_refresh_the_unmatched_tail(make):
    """Regression: a match (or insert) ending inside an edge splits it; only the part that
    was used may be refreshed, not the tail after the split."""
    h = make()
    h.insert([1, 2, 3, 4, 5])  # oldest
    h.insert([9, 9])
    h.cache.match_prefix([1, 2, 3, 7])  # uses [1 2 3] only
    assert h.cache.evict(1) == 2  # [4 5] was last used before [9 9]
    assert h.cache.match_prefix([9, 9]).prefix_len == 2
    assert h.cache.match_prefix([1, 2, 3, 4, 5]).prefix_len == 3

    h2 = make()
    h2.insert([1, 2, 3, 4, 5])
    h2.insert([9, 9])
    h2.insert([1, 2, 3, 8])  # forks inside [1..5]; the [4 5] tail was not used
    assert h2.cache.evict(1) == 2
    assert h2.cache.match_prefix([9, 9]).prefix_len == 2
    assert h2.cache.match_prefix([1, 2, 3, 4, 5]).prefix_len == 3


def test_locked_paths_are_never_evicted(make):
    h = make()
    _, keep = h.insert([1, 2, 3, 4])
    h.insert([1, 2, 5])
    h.insert([6, 6, 6])
    node = h.cache.match_prefix([1, 2, 3, 4]).last_node
    h.cache.inc_lock_ref(node)
    available = h.allocator.available
    freed = h.cache.evict(1000)
    assert freed == 4  # [5] and [6 6 6]; [1 2] [3 4] are locked
    assert h.allocator.available == available + freed
    assert as_list(h.cache.match_prefix([1, 2, 3, 4]).indices) == as_list(keep)
    assert h.cache.evict(1000) == 0
    h.cache.dec_lock_ref(node)
    assert h.cache.evict(1000) == 4


def test_parents_become_evictable_after_their_children(make):
    h = make()
    h.insert([1, 2, 3])
    h.insert([1, 2, 4])  # [1 2] -> {[3], [4]}
    assert h.cache.evict(1) == 1  # one leaf; [1 2] still has a child
    assert h.cache.total_size == 3
    assert h.cache.evict(1) == 1  # the other leaf
    assert h.cache.match_prefix([1, 2, 3]).prefix_len == 2
    assert h.cache.evict(1) == 2  # now [1 2] is a leaf
    assert h.cache.total_size == 0


def test_cascade_in_one_call(make):
    h = make()
    h.insert([1, 2, 3, 4])
    h.insert([1, 2, 3, 5])
    h.insert([1, 6])  # [1] -> {[2 3] -> {[4], [5]}, [6]}
    available = h.allocator.available
    assert h.cache.evict(6) == 6
    assert h.cache.total_size == 0
    assert h.allocator.available == available + 6


def test_cascade_respects_recency_across_branches(make):
    h = make()
    h.insert([1, 2, 3])  # t1
    h.insert([7, 7])  # t2
    h.insert([1, 2, 4])  # t3: [1 2] (t3) -> [3] (t1), [4] (t3)
    assert h.cache.evict(1) == 1  # [3]
    assert h.cache.match_prefix([1, 2, 3]).prefix_len == 2
    # (that match refreshed [1 2] only)
    assert h.cache.evict(1) == 2  # [7 7] is now the oldest leaf
    assert h.cache.match_prefix([7, 7]).prefix_len == 0
    assert h.cache.evict(2) == 3  # [4] then its parent [1 2]
    assert h.cache.total_size == 0


def test_evict_frees_whole_nodes_and_reports_the_count(make):
    h = make()
    _, slots = h.insert(list(range(10)))
    available = h.allocator.available
    assert h.cache.evict(1) == 10
    assert h.allocator.available == available + 10
    assert bool(h.allocator.is_free(slots).all())


def test_evict_zero_is_a_noop(make):
    h = make()
    h.insert([1, 2])
    before = (h.cache.total_size, h.allocator.available)
    assert h.cache.evict(0) == 0
    assert (h.cache.total_size, h.allocator.available) == before


def test_evict_more_than_cached(make):
    h = make()
    assert h.cache.evict(5) == 0
    h.insert([1, 2])
    assert h.cache.evict(5) == 2


# ====================================================================== reset
def test_reset_frees_everything(make):
    h = make()
    h.insert([1, 2, 3])
    h.insert([1, 2, 4, 5])
    h.insert([1, 2], namespace="other")
    kept = h.take(3)  # slots the test holds stay held
    h.cache.reset()
    assert h.cache.total_size == 0
    assert h.allocator.available == h.allocator.capacity - 3
    assert h.cache.match_prefix([1, 2, 3]).prefix_len == 0
    assert h.cache.match_prefix([1, 2], namespace="other").prefix_len == 0
    h.check()
    h.give_back(kept)
    p, _ = h.insert([1, 2, 3])
    assert p == 0


def test_reset_refuses_while_locked(make):
    h = make()
    h.insert([1, 2, 3])
    node = h.cache.match_prefix([1, 2]).last_node
    h.cache.inc_lock_ref(node)
    available = h.allocator.available
    with pytest.raises(RuntimeError, match="locked"):
        h.cache.reset()
    assert h.cache.total_size == 3 and h.allocator.available == available
    h.check()
    h.cache.dec_lock_ref(node)
    h.cache.reset()
    assert h.allocator.available == h.allocator.capacity


def test_reset_of_empty_cache(make):
    h = make()
    h.cache.reset()
    assert h.allocator.available == h.allocator.capacity


# ====================================================================== disable=True
@pytest.mark.parametrize("page_size", [1, 2])
def test_disabled_cache_keeps_nothing(make, page_size):
    h = make(page_size=page_size, disable=True)
    available = h.allocator.available
    slots = h.take(5)
    assert h.cache.insert([1, 2, 3, 4, 5], slots) == 0
    a = h.cache.aligned_len(5)
    h.held -= a
    assert bool(h.allocator.is_free(slots[:a]).all())  # freed by the cache
    assert not bool(h.allocator.is_free(slots[a:]).any())  # the tail is still the caller's
    h.check()
    h.give_back(slots[a:])
    assert h.allocator.available == available
    m = h.cache.match_prefix([1, 2, 3, 4, 5])
    assert m.prefix_len == 0 and m.last_node.is_root
    h.cache.inc_lock_ref(m.last_node)
    h.cache.dec_lock_ref(m.last_node)
    assert h.cache.total_size == 0
    assert h.cache.evict(10) == 0
    h.cache.reset()


# ====================================================================== bad input
@pytest.mark.parametrize(
    "tokens",
    [
        np.array([[1, 2], [3, 4]]),
        torch.tensor([[1, 2], [3, 4]]),
        [[1, 2], [3, 4]],
        np.array(3),
        [1.0, 2.0],
        np.array([1.5, 2.5]),
        torch.tensor([1.0, 2.0]),
        "abc",
        b"abc",
        ["a", "b"],
        [True, False],
        [1, True],  # a bool among ints
        [1, 2.0],
        torch.tensor([True, False]),
        [1, None],
        None,
        3,
        {1, 2},
    ],
)
def test_bad_token_ids_raise_value_error(make, tokens):
    h = make()
    h.insert([1, 2])
    with pytest.raises(ValueError, match="token_ids"):
        h.cache.match_prefix(tokens)
    slots = h.take(2)
    with pytest.raises(ValueError, match="token_ids"):
        h.cache.insert(tokens, slots)
    h.give_back(slots)
    assert h.cache.total_size == 2


@pytest.mark.parametrize(
    "indices",
    [
        [1.0, 2.0],
        torch.tensor([1.0, 2.0]),
        np.array([1.5, 2.5]),
        torch.tensor([[1, 2]]),
        [[1], [2]],
        [[1], [2, 3]],
        "ab",
        ["a", "b"],
        [1, None],
        torch.tensor([True, False]),
        None,
    ],
)
def test_bad_indices_raise_value_error(make, indices):
    h = make()
    with pytest.raises(ValueError, match="indices"):
        h.cache.insert([1, 2], indices)
    assert h.cache.total_size == 0


def test_mismatched_lengths_raise(make):
    for disable in (False, True):
        h = make(disable=disable)
        slots = h.take(3)
        with pytest.raises(ValueError, match="2 tokens but indices has 3"):
            h.cache.insert([1, 2], slots)
        with pytest.raises(ValueError, match="4 tokens but indices has 3"):
            h.cache.insert([1, 2, 3, 4], slots)
        assert h.cache.total_size == 0
        assert not bool(h.allocator.is_free(slots).any())  # nothing was freed either
        h.give_back(slots)


@pytest.mark.parametrize("bad", [-1, 1.5, "3", None])
def test_bad_evict_size_raises(make, bad):
    h = make()
    h.insert([1, 2])
    with pytest.raises(ValueError, match="num_tokens"):
        h.cache.evict(bad)
    assert h.cache.total_size == 2


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", None])
def test_bad_page_size_raises(bad):
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(SlotAllocator(8), page_size=bad)


def test_check_invariants_catches_a_leak(make):
    h = make()
    h.insert([1, 2])
    leaked = h.allocator.alloc(1)
    with pytest.raises(AssertionError, match="leak"):
        h.cache.check_invariants()
    h.allocator.free(leaked)
