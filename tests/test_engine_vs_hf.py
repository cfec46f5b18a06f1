"""The engine against transformers' own forward on the same weights (the oracle), fp32.

Greedy decoding must give the same tokens whatever the batching, chunking and prefix reuse;
logprobs must match ``log_softmax`` of transformers' logits.
"""

from __future__ import annotations

import inspect
import random

import pytest
import torch

pytestmark = pytest.mark.slow

NEW_TOKENS = 64

_TOPICS = [
    "The history of the printing press",
    "How photosynthesis works",
    "Write a Python function that reverses a linked list.",
    "List three facts about Jupiter.",
    "Explain recursion to a child.",
    "Translate 'good morning' into French, Spanish and German.",
    "What is the capital of Australia?",
    "Describe the water cycle in detail, step by step, including evaporation, condensation, precipitation and collection.",
    "def quicksort(arr):",
    "Once upon a time, in a small village by the sea,",
    "The three laws of thermodynamics are",
    "Q: What is 17 times 23?\nA:",
    "Write a haiku about autumn leaves.",
    "SELECT name, age FROM users WHERE",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "import numpy as np\n\n# compute the mean of each column\n",
]


def _prompts(tokenizer) -> list[list[int]]:
    """Mixed lengths: some chat-templated, some raw, one long (several chunks of 256)."""
    out = []
    for i, topic in enumerate(_TOPICS):
        if i % 2 == 0:
            text = tokenizer.apply_chat_template([{"role": "user", "content": topic}])
        else:
            text = topic
        if i == 7:
            text = (topic + " ") * 40  # ~1000 tokens: crosses chunk boundaries
        out.append(tokenizer.encode(text))
    return out


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def prompts(engine):
    return _prompts(engine.tokenizer)


def hf_greedy_continuations(hf_model, batch: list[list[int]], num_tokens: int) -> list[list[int]]:
    """Argmax of transformers' own logits, step by step with its KV cache, for prompts
    left-padded to one length (attention mask and positions as transformers' ``generate``
    sets them); never stops at EOS (the engine side runs with ``ignore_eos``)."""
    width = max(map(len, batch))
    step_input = torch.tensor([[0] * (width - len(ids)) + ids for ids in batch])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    out: list[list[int]] = [[] for _ in batch]
    past = None
    # transformers 5.24 names its KV cache argument and output `cache` (`past_key_values` before)
    cache_name = "cache" if "cache" in inspect.signature(type(hf_model).forward).parameters else "past_key_values"
    with torch.inference_mode():
        for _ in range(num_tokens):
            res = hf_model(step_input, attention_mask=mask, position_ids=positions, use_cache=True, **{cache_name: past})
            past = res[cache_name]
            tokens = res.logits[:, -1].argmax(-1)
            for row, token in zip(out, tokens.tolist(), strict=True):
                row.append(token)
            step_input = tokens[:, None]
            mask = torch.cat([mask, torch.ones(len(batch), 1, dtype=mask.dtype)], dim=1)
            positions = positions[:, -1:] + 1
    return out


@pytest.fixture(scope="module")
def hf_greedy(hf_model, prompts):
    """Transformers' greedy continuation of each prompt: the short prompts as one padded
    batch (a fifth of the time one at a time takes, the same tokens), the long one alone so
    that the others do not pay for its padding."""
    short = [i for i, ids in enumerate(prompts) if len(ids) <= 64]
    batches = [short] + [[i] for i in range(len(prompts)) if i not in short]
    want: dict[int, list[int]] = {}
    for batch in batches:
        want.update(zip(batch, hf_greedy_continuations(hf_model, [prompts[i] for i in batch], NEW_TOKENS), strict=True))
    return [want[i] for i in range(len(prompts))]


GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def _check_same(outs, hf_greedy):
    for i, (out, ref) in enumerate(zip(outs, hf_greedy, strict=True)):
        assert out["output_ids"] == ref, f"prompt {i}: engine and transformers diverge"


def test_greedy_batch_matches_transformers(engine, prompts, hf_greedy):
    engine.flush_cache()
    _check_same(engine.generate(input_ids=prompts, sampling_params=GREEDY), hf_greedy)


def test_greedy_with_warm_prefix_cache_matches(engine, prompts, hf_greedy):
    # Every prompt is now cached: this run reuses prefixes (cached_tokens > 0) and must agree.
    outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs)
    _check_same(outs, hf_greedy)


def test_greedy_matches_with_radix_off_and_small_chunks(model_dir, prompts, hf_greedy):
    """No prefix reuse at all, and the long prompt in 16 chunks of 64 (the shared engine
    reuses prefixes and prefills in chunks of 256)."""
    from runtime.engine import Engine

    eng = Engine(str(model_dir), dtype="float32", max_total_tokens=40_000, disable_radix_cache=True,
                 chunked_prefill_size=64)
    outs = eng.generate(input_ids=prompts, sampling_params=GREEDY)
    _check_same(outs, hf_greedy)
    assert all(o["meta_info"]["cached_tokens"] == 0 for o in outs)
    eng.scheduler.check_invariants()


def test_logprobs_match_transformers(engine, hf_model, prompts):
    ids = prompts[3]
    out = engine.generate(
        input_ids=ids,
        sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
    )
    full = ids + out["output_ids"]
    with torch.inference_mode():
        ref = torch.log_softmax(hf_model(torch.tensor([full])).logits[0].float(), dim=-1)
    meta = out["meta_info"]
    inputs = meta["input_token_logprobs"]
    assert inputs[0][0] is None and len(inputs) == len(ids)
    for pos in range(1, len(ids)):
        lp, tid, _ = inputs[pos]
        assert tid == ids[pos]
        assert abs(lp - ref[pos - 1, tid].item()) < 1e-3
    for k, (lp, tid, _) in enumerate(meta["output_token_logprobs"]):
        assert abs(lp - ref[len(ids) - 1 + k, tid].item()) < 1e-3
        top = meta["output_top_logprobs"][k]
        ref_top = ref[len(ids) - 1 + k].topk(3)
        assert [t for _, t, _ in top] == ref_top.indices.tolist()


def test_logprob_start_len_limits_prefix_reuse(engine, hf_model, prompts):
    ids = prompts[5]
    engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0})  # now fully cached
    start = len(ids) - 4
    out = engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=start,
    )
    lps = out["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in lps] == ids[start:]
    # as SGLang: the token at logprob_start_len has none (the positions before it are reused)
    assert lps[0][0] is None and all(lp is not None for lp, _, _ in lps[1:])
    assert out["meta_info"]["cached_tokens"] == start
    with torch.inference_mode():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    for pos in range(start + 1, len(ids)):
        assert abs(lps[pos - start][0] - ref[pos - 1, ids[pos]].item()) < 1e-3


def test_shared_prefix_is_reused_and_output_unchanged(engine):
    rng = random.Random(0)
    words = ["alpha", "river", "stone", "cloud", "maple", "signal", "orbit", "lantern"]
    prefix = " ".join(rng.choice(words) for _ in range(500))
    prefix_ids = engine.tokenizer.encode(prefix)
    assert len(prefix_ids) >= 500
    params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    engine.flush_cache()
    engine.generate(input_ids=prefix_ids + engine.tokenizer.encode(" first question"), sampling_params=params)
    second = prefix_ids + engine.tokenizer.encode(" second question")
    warm = engine.generate(input_ids=second, sampling_params=params)
    assert warm["meta_info"]["cached_tokens"] >= 500
    engine.flush_cache()
    cold = engine.generate(input_ids=second, sampling_params=params)
    assert cold["meta_info"]["cached_tokens"] == 0
    assert warm["output_ids"] == cold["output_ids"]


def test_memory_pressure_retracts_without_changing_outputs(model_dir, engine):
    from runtime.engine import Engine

    rng = random.Random(1)
    vocab = engine.worker.model_config.vocab_size
    prompts = [[rng.randrange(100, vocab) for _ in range(rng.randrange(130, 170))] for _ in range(8)]
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    # About 2.5 of the 8 requests fit at once: 4 retractions here.
    small = Engine(str(model_dir), dtype="float32", max_total_tokens=500, chunked_prefill_size=128)
    got = small.generate(input_ids=prompts, sampling_params=params)
    small.scheduler.check_invariants()
    assert small.scheduler.send_back.num_retractions > 0, "the pool was meant to be too small for all requests"
    engine.flush_cache()
    want = engine.generate(input_ids=prompts, sampling_params=params)
    for g, w in zip(got, want, strict=True):
        assert g["output_ids"] == w["output_ids"]
        assert g["meta_info"]["completion_tokens"] == 40
