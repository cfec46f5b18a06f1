"""Every architecture the engine serves, against transformers' own forward (the oracle).

Tiny random-weight checkpoints (Llama tied / untied with llama3 rope scaling, Qwen2 with
q/k/v bias, Mistral) are built with transformers, saved as HF folders with the default
model's tokenizer, and served by the engine in fp32: greedy tokens must equal transformers'
argmax loop and prompt logprobs its ``log_softmax``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tests.tiny_models import VOCAB, build_hf_model, random_prompts, save_hf_folder

NEW_TOKENS = 12
PROMPT_LENS = (5, 40, 90)
LOGPROB_TOL = 1e-4
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
_LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
CASES = {
    "llama_tied": ("Llama", dict(tie_word_embeddings=True)),
    "llama3_rope_untied": (
        "Llama",
        dict(tie_word_embeddings=False, rope_theta=500000.0, rope_scaling=_LLAMA3_SCALING),
    ),
    "qwen2_bias": ("Qwen2", dict(tie_word_embeddings=False)),
    "mistral": ("Mistral", dict(tie_word_embeddings=False, sliding_window=None)),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The models are tiny: one thread is as fast, and far faster on a busy machine, where
    intra-op threads spend their time waiting on each other. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def build_case(tmp_path_factory, model_dir):
    """Build (once per module) a case's HF folder: safetensors weights, config, generation
    config and the default model's tokenizer files. Returns (folder, transformers model)."""
    built: dict[str, tuple[Path, torch.nn.Module]] = {}

    def build(name: str) -> tuple[Path, torch.nn.Module]:
        if name not in built:
            family, extra = CASES[name]
            hf_model = build_hf_model(family, extra)
            folder = save_hf_folder(hf_model, tmp_path_factory.mktemp(name), model_dir)
            built[name] = (folder, hf_model)
        return built[name]

    return build


@pytest.fixture(params=list(CASES))
def arch(request, build_case):
    """(name, folder, transformers model) for one architecture case."""
    return (request.param, *build_case(request.param))


def hf_oracle(hf_model, ids: list[int], num_tokens: int = NEW_TOKENS) -> tuple[list[int], torch.Tensor]:
    """Transformers' greedy continuation (argmax, recomputing the whole sequence each step,
    never stopping at EOS) and the ``log_softmax`` over prompt + output, where ``ref[p]`` is
    the distribution of token ``p + 1``."""
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(num_tokens):
            logits = hf_model(torch.tensor([ids + out]), logits_to_keep=1).logits[0, -1]
            out.append(int(logits.argmax()))
        full = hf_model(torch.tensor([ids + out])).logits[0].float()
    return out, torch.log_softmax(full, dim=-1)


def test_config_keys_are_read(arch):
    """transformers 5 writes ``rope_parameters``; the engine's config must see theta and scaling."""
    from runtime.models.config import ModelConfig

    name, folder, hf_model = arch
    raw = json.loads((folder / "config.json").read_text())
    cfg = ModelConfig.from_hf(raw)
    assert cfg.tie_word_embeddings == hf_model.config.tie_word_embeddings
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.qkv_bias == (name == "qwen2_bias")
    if name == "llama3_rope_untied":
        assert cfg.rope_theta == 500000.0
        assert cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "llama3"
        assert cfg.rope_scaling["original_max_position_embeddings"] == 64
    else:
        assert cfg.rope_theta == 10000.0
        assert cfg.rope_scaling is None
    # The transformers 4 shape (top-level rope_theta / rope_scaling) must read the same.
    legacy = {k: v for k, v in raw.items() if k != "rope_parameters"}
    params = dict(raw.get("rope_parameters") or {})
    legacy["rope_theta"] = params.pop("rope_theta", cfg.rope_theta)
    if params.get("rope_type", "default") != "default":
        legacy["rope_scaling"] = params
    old = ModelConfig.from_hf(legacy)
    assert old.rope_theta == cfg.rope_theta
    assert (old.rope_scaling is None) == (cfg.rope_scaling is None)
    if cfg.rope_scaling is not None:
        for key in ("rope_type", "factor", "low_freq_factor", "high_freq_factor"):
            assert old.rope_scaling[key] == cfg.rope_scaling[key]


def test_greedy_and_prompt_logprobs_match_transformers(arch):
    from runtime.engine import Engine

    name, folder, hf_model = arch
    prompts = random_prompts(1, PROMPT_LENS)
    engine = Engine(str(folder), dtype="float32", max_total_tokens=4096)
    outs = engine.generate(
        input_ids=prompts, sampling_params=GREEDY, return_logprob=True, logprob_start_len=0
    )
    for i, (ids, out) in enumerate(zip(prompts, outs, strict=True)):
        want, ref = hf_oracle(hf_model, ids)
        assert out["output_ids"] == want, f"{name} prompt {i}: engine and transformers diverge"
        inputs = out["meta_info"]["input_token_logprobs"]
        assert len(inputs) == len(ids) and inputs[0][0] is None
        for pos in range(1, len(ids)):
            lp, tid, _ = inputs[pos]
            assert tid == ids[pos]
            assert abs(lp - ref[pos - 1, tid].item()) < LOGPROB_TOL, f"{name} prompt {i} pos {pos}"
        for k, (lp, tid, _) in enumerate(out["meta_info"]["output_token_logprobs"]):
            assert tid == want[k]
            assert abs(lp - ref[len(ids) - 1 + k, tid].item()) < LOGPROB_TOL, f"{name} prompt {i} out {k}"
    engine.scheduler.check_invariants()


def test_paged_prefix_reuse_with_small_chunks(build_case):
    """Llama (scaled rope, positions past 64), page_size 4 and 16-token chunks: the second
    request reuses the shared 50-token prefix rounded down to whole pages."""
    from runtime.engine import Engine

    folder, hf_model = build_case("llama3_rope_untied")

    rng = random.Random(2)
    prefix = [rng.randrange(VOCAB) for _ in range(50)]
    first = prefix + [rng.randrange(VOCAB) for _ in range(20)]
    second = prefix + [rng.randrange(VOCAB) for _ in range(25)]
    second[50] = (first[50] + 1) % VOCAB  # the prompts part right after the shared prefix
    engine = Engine(
        str(folder), dtype="float32", max_total_tokens=4096, page_size=4, chunked_prefill_size=16
    )
    out1 = engine.generate(input_ids=first, sampling_params=GREEDY)
    out2 = engine.generate(input_ids=second, sampling_params=GREEDY)
    assert out1["meta_info"]["cached_tokens"] == 0
    cached = out2["meta_info"]["cached_tokens"]
    assert cached % 4 == 0 and 48 <= cached <= 50, cached
    assert out1["output_ids"] == hf_oracle(hf_model, first)[0]
    assert out2["output_ids"] == hf_oracle(hf_model, second)[0]
    engine.scheduler.check_invariants()


def test_a_model_built_on_a_real_device_has_initialised_weights():
    """The loader builds the model on the meta device and fills it from the checkpoint; a
    model built on the CPU (the random-weight tests) must hold ``nn.Embedding``'s own init,
    not uninitialised memory (a tied head on such memory gave NaN logits at random)."""
    from runtime.models.config import ModelConfig
    from runtime.models.llama import LlamaForCausalLM

    cfg = ModelConfig.from_hf(dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=96,
                                   num_hidden_layers=1, vocab_size=300, max_position_embeddings=32, rms_norm_eps=1e-5,
                                   tie_word_embeddings=True))
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    torch.manual_seed(0)
    reference = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    assert torch.equal(model.embed_tokens.weight, reference.weight)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    with torch.device("meta"):
        assert LlamaForCausalLM(cfg).embed_tokens.weight.is_meta
