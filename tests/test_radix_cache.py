"""Unit tests for radix_cache.RadixCache (the allocator and table: test_slot_bookkeeping.py).

Every test that builds a cache goes through the ``make`` fixture, which runs
``check_invariants`` (with the slots the test still holds) when the test ends.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch


def as_list(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.tolist()]

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


def test_namespaces_with_nothing_cached_are_not_kept(make):
    # A fresh cache_salt per request: lookups add nothing, and an evicted namespace goes.
    h = make()
    for i in range(50):
        assert h.cache.match_prefix([1, 2, 3], namespace=f"salt-{i}").prefix_len == 0
    h.insert([1, 2, 3], namespace="salt-kept")
    h.insert([4, 5], namespace="salt-gone")
    assert h.cache.match_prefix([4, 5], namespace="salt-gone").prefix_len == 2
    m = h.cache.match_prefix([1, 2, 3], namespace="salt-kept")
    h.cache.inc_lock_ref(m.last_node)
    assert h.cache.evict(10) == 2
    assert set(h.cache._roots) == {"salt-kept"}
    _, again = h.insert([4, 5], namespace="salt-gone")  # a new root, the same behaviour
    assert as_list(h.cache.match_prefix([4, 5], namespace="salt-gone").indices) == as_list(again)
    h.cache.dec_lock_ref(m.last_node)


def test_an_insert_shorter_than_a_page_keeps_no_root(make):
    h = make(page_size=4)
    slots = h.take(3)
    assert h.cache.insert([1, 2, 3], slots, namespace="salt-short") == 0  # nothing whole to cache
    assert "salt-short" not in h.cache._roots


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
