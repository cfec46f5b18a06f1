"""RadixCache eviction, reset, disabled mode and input validation (tree basics:
test_radix_cache.py). The ``make`` fixture (tests/conftest.py) checks invariants at the end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radix_cache import RadixCache, SlotAllocator


def as_list(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.tolist()]


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
