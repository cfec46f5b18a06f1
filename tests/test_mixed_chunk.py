"""Prefill steps that carry the running requests' decode tokens (``disable_mixed_chunk``
off, the default): the same greedy tokens and logprobs as separate prefill and decode
steps (float32, where the kernels' rows do not depend on the batch), the running requests
really decode inside prefill steps, and the KV pool's accounting holds."""

from __future__ import annotations

import pytest

from runtime.engine import Engine
from tests.tiny_models import random_prompts


def _run(model_dir, mixed: bool, tight_pool: bool = False) -> tuple[list[dict], list[int], dict[str, int]]:
    engine = Engine(str(model_dir), dtype="float32", chunked_prefill_size=24, disable_mixed_chunk=not mixed,
                    max_total_tokens=200 if tight_pool else 4000)
    mixed_rows: list[int] = []
    scheduled = engine.scheduler._prefill_batch

    def recording():
        batch = scheduled()
        if batch is not None:
            mixed_rows.append(batch.num_mixed_decodes)
        return batch

    engine.scheduler._prefill_batch = recording
    try:
        prompts = random_prompts(11, (30, 70, 45, 9, 100))
        params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in (20, 6, 15, 30, 8)]
        out = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True, logprob_start_len=0)
        engine.scheduler.check_invariants()
        assert engine.scheduler.stats()["kv_held_by_requests"] == 0
        return out, mixed_rows, engine.scheduler.stats()
    finally:
        engine.shutdown()


@pytest.mark.parametrize("tight_pool", [False, True], ids=["roomy", "tight"])
def test_mixed_steps_give_the_same_tokens_as_separate_steps(tiny_gqa_llama, tight_pool):
    mixed, mixed_rows, mixed_stats = _run(tiny_gqa_llama, True, tight_pool)
    plain, plain_rows, plain_stats = _run(tiny_gqa_llama, False, tight_pool)
    assert any(mixed_rows), "no prefill step carried decode tokens"
    assert not any(plain_rows)
    if tight_pool:  # requests were sent back to the queue to free memory, in both ways
        assert mixed_stats["num_retractions"] > 0 and plain_stats["num_retractions"] > 0
    else:  # decode tokens are not counted as prompt tokens
        assert mixed_stats["num_prefill_tokens"] == plain_stats["num_prefill_tokens"]
    for a, b in zip(mixed, plain, strict=True):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]
        for key in ("input_token_logprobs", "output_token_logprobs"):
            ours, theirs = a["meta_info"][key], b["meta_info"][key]
            assert [t[1] for t in ours] == [t[1] for t in theirs]
            assert all(x[0] == y[0] or abs(x[0] - y[0]) < 1e-4 for x, y in zip(ours, theirs, strict=True) if x[0] is not None)
