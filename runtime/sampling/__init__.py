"""Sampling parameters (validated user input) and the batched sampler."""

from runtime.sampling.params import SamplingParams

__all__ = ["SamplingParams"]
