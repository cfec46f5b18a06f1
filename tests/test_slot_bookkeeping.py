"""Unit tests for the KV slot bookkeeping beside the tree: SlotAllocator and ReqToTokenTable."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radix_cache import ReqToTokenTable, SlotAllocator


def as_list(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.tolist()]


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
