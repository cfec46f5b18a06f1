"""End to end on a GPU: the same prompts through engines with each attention backend
(bfloat16, CUDA graphs on where supported, fused Triton elementwise kernels) give the same
greedy tokens as torch_native with plain PyTorch layers, up
to the reference's first near-tie, and prompt logprobs as close to torch_native in float32
as torch_native in bfloat16 is (see greedy_compare)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.gpu.greedy_compare import agreed_prefix, prompt_logprob_diffs, within_bf16_noise

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

NEW_TOKENS = 32
SAMPLING = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
TEXTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "List three prime numbers greater than 100 and explain why each is prime.",
]
SHARED = 300  # tokens of prefix the last two prompts share


def _prompts(tokenizer) -> list[list[int]]:
    """Chat-free text prompts, one long random one, and two sharing a 300-token prefix
    (the second reuses the first's cache: an extend with a prefix)."""
    ids = [tokenizer.encode(t) for t in TEXTS]
    rng = random.Random(0)
    shared = [rng.randrange(1000, 40000) for _ in range(SHARED)]
    ids.append([rng.randrange(1000, 40000) for _ in range(1500)])
    ids.append(shared + [rng.randrange(1000, 40000) for _ in range(20)])
    ids.append(shared + [rng.randrange(1000, 40000) for _ in range(45)])
    return ids


def _generate(model_dir, backend: str, prompts: list[list[int]], dtype: str = "bfloat16", **options) -> list[dict]:
    from runtime.engine import Engine

    engine = Engine(
        str(model_dir), device="cuda", dtype=dtype, attention_backend=backend, max_total_tokens=65536, **options
    )
    try:
        # One batch, then the last prompt alone so it finds the shared prefix cached. A
        # request's prefix match stops where its prompt logprobs start (cached tokens have
        # no logits), so the last prompt's logprobs start just after the shared prefix.
        outs = engine.generate(
            input_ids=prompts[:-1], sampling_params=SAMPLING, return_logprob=True, logprob_start_len=0,
            top_logprobs_num=2,
        )
        outs.append(
            engine.generate(
                input_ids=prompts[-1], sampling_params=SAMPLING, return_logprob=True,
                logprob_start_len=SHARED + 1, top_logprobs_num=2,
            )
        )
        assert outs[-1]["meta_info"]["cached_tokens"] == SHARED
        engine.scheduler.check_invariants()
        return outs
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def reference(gpu_model_dir):
    """The prompts, torch_native's outputs in float32 (the numeric reference) and in
    bfloat16 (the token reference, and the size of bfloat16's own error). The references run
    every layer as plain PyTorch ops, the fused Triton norms, rotary and SiLU included."""
    from runtime.tokenizer import Tokenizer

    prompts = _prompts(Tokenizer(gpu_model_dir))
    plain = {"disable_fused_elementwise": True}
    exact = _generate(gpu_model_dir, "torch_native", prompts, dtype="float32", **plain)
    bf16 = _generate(gpu_model_dir, "torch_native", prompts, **plain)
    return prompts, exact, bf16


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_greedy_output_matches_torch_native(backend, reference, gpu_model_dir):
    if backend == "flashinfer":
        pytest.importorskip("flashinfer", reason="flashinfer is not installed (pip install .[cuda])")
    prompts, exact, bf16 = reference
    got = _generate(gpu_model_dir, backend, prompts)
    failures = []
    for i, (ref_exact, ref_bf16, out) in enumerate(zip(exact, bf16, got, strict=True)):
        ok, where = agreed_prefix(ref_bf16, out, exact=ref_exact)
        baseline, distance = prompt_logprob_diffs(ref_exact, ref_bf16), prompt_logprob_diffs(ref_exact, out)
        print(
            f"{backend} prompt {i}: {where}; prompt logprobs vs float32: max {distance[0]:.4f} mean {distance[1]:.5f}"
            f" (torch_native bf16: max {baseline[0]:.4f} mean {baseline[1]:.5f})"
        )
        if not ok:
            failures.append(f"prompt {i}: tokens differ from torch_native before the first near-tie ({where})")
        if not within_bf16_noise(distance, baseline):
            failures.append(f"prompt {i}: prompt logprobs {distance} from float32, torch_native bf16 {baseline}")
    assert not failures, "\n".join(failures)


def test_greedy_on_the_device_equals_the_host_sampler(gpu_model_dir):
    """Plain greedy steps take the argmax on the GPU (``Worker.greedy_on_device``): the same
    tokens as copying the logits to the host sampler (same engine, cache off so both runs
    compute the same batches)."""
    from runtime.engine import Engine
    from runtime.tokenizer import Tokenizer

    prompts = _prompts(Tokenizer(gpu_model_dir))
    engine = Engine(str(gpu_model_dir), device="cuda", dtype="bfloat16", attention_backend="triton",
                    max_total_tokens=65536, disable_radix_cache=True)
    try:
        outs = {}
        for on_device in (False, True):
            engine.worker.greedy_on_device = on_device
            outs[on_device] = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=SAMPLING)]
        assert outs[True] == outs[False]
    finally:
        engine.shutdown()
