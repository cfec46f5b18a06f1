"""A seeded request's own uniform numbers, one per sampled token.

Seeds are 64-bit here (``SamplingParams`` accepts -2**63 .. 2**64 - 1, taken modulo 2**64,
as vLLM and SGLang accept them). torch's CPU generator keeps only a seed's low 32 bits
(its mt19937 is seeded from 32), so seeds 0 and 2**32 would draw the same tokens; agents
and evaluation loops that draw random 64-bit seeds would then meet repeats after some 10**5
calls. A ``SeedStream`` walks a 64-bit counter from the scrambled seed and scrambles each
step (SplitMix64's increment and output function), so every seed modulo 2**64 starts its
own stream.
"""

from __future__ import annotations

import math

import torch

_MASK = (1 << 64) - 1
_STEP = 0x9E3779B97F4A7C15  # 2**64 over the golden ratio, odd: the counter visits every value


def _scramble(z: int) -> int:
    """SplitMix64's output function: a bijection of 64-bit integers that mixes every bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class SeedStream:
    """Uniform numbers in [0, 1) from a 64-bit seed; the same seed gives the same numbers."""

    def __init__(self, seed: int) -> None:
        self._counter = _scramble(seed & _MASK)

    def uniform(self, dtype: torch.dtype) -> torch.Tensor:
        """The next number as a 0-d tensor of ``dtype``: as many top bits of the step's 64 as
        the type's significand holds, so it is exact there and below 1."""
        self._counter = (self._counter + _STEP) & _MASK
        bits = 1 - int(math.log2(torch.finfo(dtype).eps))  # float32 24, float64 53
        return torch.tensor((_scramble(self._counter) >> (64 - bits)) * 2.0**-bits, dtype=dtype)
