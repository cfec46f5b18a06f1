"""The prompt-lookup drafter (runtime/scheduler/ngram_lookup.py): the incremental index
against a scan of the whole token list, on random token streams fed in random pieces."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.scheduler.ngram_lookup import NgramLookup, draft_by_scan


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 5), max_size=60),  # a small alphabet: many repeats
    cuts=st.lists(st.integers(0, 60), max_size=6),
    sizes=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    k=st.integers(0, 6),
)
def test_the_index_drafts_what_a_scan_of_the_whole_context_drafts(tokens, cuts, sizes, k):
    min_n, max_n = sizes[0], sizes[0] + sizes[1]
    lookup = NgramLookup(min_n, max_n)
    start = 0
    for cut in [*sorted(cuts), len(tokens)]:
        lookup.extend(tokens[start:max(start, cut)])
        start = max(start, cut)
        seen = tokens[:start]
        assert lookup.draft(k) == draft_by_scan(seen, k, min_n, max_n)


def test_a_draft_continues_the_latest_earlier_occurrence_of_the_longest_suffix():
    lookup = NgramLookup(1, 3)
    lookup.extend([7, 1, 2, 3, 9, 1, 2, 3, 4, 5, 8, 2, 3])
    # "2 3" last occurred followed by 4; "8 2 3" never did before, so the 2-gram decides
    assert lookup.draft(3) == [4, 5, 8]
    assert lookup.draft(0) == []
    lookup.extend([6])  # "3 6", "6" occur nowhere before
    assert lookup.draft(3) == []


def test_the_sizes_must_make_sense():
    with pytest.raises(ValueError, match="1 <= min <= max"):
        NgramLookup(2, 1)
    with pytest.raises(ValueError, match="1 <= min <= max"):
        NgramLookup(0, 3)
