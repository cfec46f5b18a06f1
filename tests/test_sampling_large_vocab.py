"""The sampler's fast paths on the default model's vocabulary (49,152 tokens), no model
loaded: ``filter_probs`` leaves rows that filter nothing alone and cuts the others to their
most likely tokens, sorting a whole row only when its kept set might reach past them; it must
keep exactly the tokens of the full sort (``filter_probs_sorted``). ``draw_rows`` draws by
inverting each row's cumulative sum; its draws must never land on a zero and must follow the
distribution. The definitions themselves are checked on small vocabularies against a
brute-force reference in ``tests/test_sampling.py``."""

from __future__ import annotations

import pytest
import torch

from runtime.sampling.sampler import draw_rows, filter_probs, filter_probs_sorted


def test_disabled_filters_leave_a_peaked_large_vocab_distribution_unchanged():
    """top_k=-1, top_p=1, min_p=0 (the defaults) must not drop any token. On a realistic,
    peaked 49k-token distribution the float32 cumulative sum reaches 1.0 before the tail, so
    a plain ``mass_before >= top_p`` test would drop thousands of tail tokens."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 49152, generator=gen) * torch.tensor([[1.0], [3.0], [5.0], [10.0]])
    probs = torch.softmax(logits, -1)
    out = filter_probs(probs, torch.tensor([-1] * 4), torch.ones(4), torch.zeros(4))
    assert int(((out == 0) & (probs > 0)).sum()) == 0
    torch.testing.assert_close(out, probs / probs.sum(-1, keepdim=True), atol=0, rtol=1e-5)
    # top_k alone on the same rows: exactly k survive, whatever the tail
    out = filter_probs(probs, torch.tensor([50] * 4), torch.ones(4), torch.zeros(4))
    assert ((out > 0).sum(-1) == 50).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_filter_probs_on_a_large_vocabulary_equals_the_full_sort(seed):
    """filter_probs cuts rows to their most likely tokens before sorting and sorts whole
    only the rows whose kept set might reach past them; either way it must keep the very
    tokens the full sort keeps. The rows run from flat (a 0.99 nucleus of thousands of
    tokens: the whole-row path) to peaked (a nucleus of a few: the cut path)."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.tensor([0.3, 1.0, 3.0, 6.0, 12.0])
    cases = [(-1, 0.9, 0.0), (-1, 0.99, 0.0), (40, 1.0, 0.0), (300, 0.95, 0.0), (-1, 1.0, 0.05),
             (-1, 1.0, 1e-6), (20, 0.8, 0.1), (-1, 0.5, 0.0)]
    logits = torch.randn(len(cases) * len(scales), 49152, generator=gen) * scales.repeat(len(cases)).unsqueeze(1)
    probs = torch.softmax(logits, -1)
    k = torch.tensor([c[0] for c in cases for _ in scales])
    p = torch.tensor([c[1] for c in cases for _ in scales])
    m = torch.tensor([c[2] for c in cases for _ in scales])
    fast, full = filter_probs(probs, k, p, m), filter_probs_sorted(probs, k, p, m)
    assert torch.equal(fast > 0, full > 0)
    torch.testing.assert_close(fast, full, atol=1e-7, rtol=1e-5)
    kept = (full > 0).sum(-1)
    assert kept.max() > 1000 and kept.min() < 50  # both paths were taken


def test_draw_rows_never_draws_a_zero_and_matches_the_distribution():
    """Inverse-CDF draws on a 49k vocabulary with exact zeros between the live tokens."""
    vocab, n = 49152, 20_000
    live = torch.tensor([3, 4, 9000, 30000, 49151])
    row = torch.zeros(vocab)
    row[live] = torch.tensor([0.1, 0.2, 0.3, 0.15, 0.25])
    row[10:20] = 1e-12  # tiny but alive: may be drawn, must not break anything
    gen, probs = torch.Generator().manual_seed(11), row.repeat(500, 1)
    draws = torch.cat([draw_rows(probs, [gen] * len(probs)) for _ in range(n // len(probs))])
    assert bool(((draws >= 10) & (draws < 20) | torch.isin(draws, live)).all())
    freq = torch.bincount(draws, minlength=vocab)[live].double() / n
    ref = row[live].double()
    assert torch.all((freq - ref).abs() <= 5 * torch.sqrt(ref * (1 - ref) / n))
