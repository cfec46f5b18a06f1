"""End to end on a GPU: the same prompts through engines with each attention backend
(bfloat16, CUDA graphs on where supported) give the same greedy tokens as torch_native, up
to the reference's first near-tie, and prompt logprobs within bfloat16 tolerance."""

from __future__ import annotations

import random

import pytest
import torch

from tests.gpu.greedy_compare import (
    LOGPROB_MAX_DIFF,
    LOGPROB_MEAN_DIFF,
    agreed_prefix,
    prompt_logprob_diffs,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

NEW_TOKENS = 32
SAMPLING = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
TEXTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "List three prime numbers greater than 100 and explain why each is prime.",
]


def _prompts(tokenizer) -> list[list[int]]:
    """Chat-free text prompts, one long random one, and two sharing a 300-token prefix
    (the second reuses the first's cache: an extend with a prefix)."""
    ids = [tokenizer.encode(t) for t in TEXTS]
    rng = random.Random(0)
    shared = [rng.randrange(1000, 40000) for _ in range(300)]
    ids.append([rng.randrange(1000, 40000) for _ in range(1500)])
    ids.append(shared + [rng.randrange(1000, 40000) for _ in range(20)])
    ids.append(shared + [rng.randrange(1000, 40000) for _ in range(45)])
    return ids


def _generate(model_dir, backend: str, prompts: list[list[int]], **engine_args) -> list[dict]:
    from runtime.engine import Engine

    engine = Engine(
        str(model_dir), device="cuda", dtype="bfloat16", attention_backend=backend, max_total_tokens=65536,
        **engine_args,
    )
    try:
        # One batch, then the last prompt alone so it finds the shared prefix cached.
        outs = engine.generate(
            input_ids=prompts[:-1], sampling_params=SAMPLING, return_logprob=True, logprob_start_len=0,
            top_logprobs_num=2,
        )
        outs.append(
            engine.generate(
                input_ids=prompts[-1], sampling_params=SAMPLING, return_logprob=True, logprob_start_len=0,
                top_logprobs_num=2,
            )
        )
        assert outs[-1]["meta_info"]["cached_tokens"] >= 300
        engine.scheduler.check_invariants()
        return outs
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def reference(gpu_model_dir):
    from runtime.tokenizer import Tokenizer

    prompts = _prompts(Tokenizer(gpu_model_dir))
    return prompts, _generate(gpu_model_dir, "torch_native", prompts)


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_greedy_output_matches_torch_native(backend, reference, gpu_model_dir):
    if backend == "flashinfer":
        pytest.importorskip("flashinfer", reason="flashinfer is not installed (pip install .[cuda])")
    prompts, want = reference
    got = _generate(gpu_model_dir, backend, prompts)
    failures = []
    for i, (ref, out) in enumerate(zip(want, got, strict=True)):
        ok, where = agreed_prefix(ref, out)
        worst, mean = prompt_logprob_diffs(ref, out)
        print(f"{backend} prompt {i}: {where}; prompt logprob diff max {worst:.4f} mean {mean:.5f}")
        if not ok:
            failures.append(f"prompt {i}: tokens differ before the first near-tie ({where})")
        if worst > LOGPROB_MAX_DIFF or mean > LOGPROB_MEAN_DIFF:
            failures.append(f"prompt {i}: prompt logprobs differ by max {worst:.4f}, mean {mean:.5f}")
    assert not failures, "\n".join(failures)
