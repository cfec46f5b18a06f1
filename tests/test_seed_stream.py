"""``runtime/sampling/seed_stream.py``: a seeded request's uniform numbers. How the sampler
draws with them (64-bit seeds, modulo 2**64, the frequencies) is in tests/test_sampling.py."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.sampling.seed_stream import SeedStream


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_seed_stream_numbers_are_uniform_in_the_unit_interval(dtype):
    stream, n = SeedStream(2024), 20_000
    u = torch.stack([stream.uniform(dtype) for _ in range(n)]).double()
    assert u.min() >= 0 and u.max() < 1
    # each of 20 equal bins holds Binomial(n, 1/20): 5 standard deviations (~154) of slack
    counts = torch.histc(u, bins=20, min=0, max=1)
    assert (counts - n / 20).abs().max() <= 5 * math.sqrt(n * 0.05 * 0.95), counts
    # consecutive numbers uncorrelated: the lag-1 correlation of n draws has sd 1/sqrt(n)
    centred = u - u.mean()
    assert abs(float((centred[1:] * centred[:-1]).mean() / centred.var())) < 5 / math.sqrt(n)


def test_seed_stream_numbers_are_exact_below_one_in_their_type():
    # as many bits as the type's significand: never rounded up to 1 (a zero target would
    # draw the first token whatever its probability)
    for dtype in (torch.float32, torch.float64):
        stream = SeedStream(7)
        for _ in range(1000):
            u = stream.uniform(dtype)
            assert u.dtype == dtype and 0 <= float(u) < 1
            scaled = float(u) * 2 ** (1 - int(math.log2(torch.finfo(dtype).eps)))
            assert scaled == int(scaled)
