"""Tiny random-weight checkpoints for end-to-end tests: built with transformers, saved as HF
folders (safetensors, config, generation config) with the default model's tokenizer files,
so the engine loads them like any model folder."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch

VOCAB = 49152  # the default (SmolLM2) tokenizer's vocabulary, so its files can be reused
TINY_SIZES: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=VOCAB,
    max_position_embeddings=2048,
)


def build_hf_model(family: str, extra: dict[str, Any], sizes: dict[str, Any] | None = None) -> torch.nn.Module:
    """A ``{family}ForCausalLM`` with seeded weights large enough that greedy choices are
    clear-cut (default inits give near-uniform logits, where ties hide bugs)."""
    import transformers

    config_cls = getattr(transformers, f"{family}Config")
    model_cls = getattr(transformers, f"{family}ForCausalLM")
    config = config_cls(**{**TINY_SIZES, **(sizes or {})}, **extra)
    torch.manual_seed(0)
    model = model_cls(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:  # includes the q/k/v biases of Qwen2: non-zero, random
                param.normal_(0.0, 0.5)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def save_hf_folder(model: torch.nn.Module, folder: Path, tokenizer_dir: Path) -> Path:
    """Save ``model`` as an HF folder the engine can serve, with ``tokenizer_dir``'s tokenizer."""
    from transformers import GenerationConfig

    model.save_pretrained(folder, safe_serialization=True)
    GenerationConfig.from_model_config(model.config).save_pretrained(folder)
    for tok_file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(tokenizer_dir) / tok_file).is_file():
            shutil.copy(Path(tokenizer_dir) / tok_file, Path(folder) / tok_file)
    return Path(folder)


def random_prompts(seed: int, lens: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in lens]


def greedy_tokens_by_backend(
    model_dir: Path, backends: tuple[str, ...], prompt_lens: tuple[int, ...], new_tokens: int, seed: int
) -> dict[str, list[list[int]]]:
    """Greedy output ids per attention backend for prompts of ``prompt_lens`` run as one
    batch (chunked prefill of 64, batched decode), then one more prompt that shares 60
    tokens with the third and must find them cached. Checks the KV pool after each."""
    from runtime.engine import Engine

    prompts = random_prompts(seed, prompt_lens)
    prompts.append(prompts[2][:60] + random_prompts(seed + 1, (9,))[0])
    greedy = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    outputs = {}
    for backend in backends:
        engine = Engine(str(model_dir), dtype="float32", max_total_tokens=2048, chunked_prefill_size=64,
                        attention_backend=backend)
        try:
            first = engine.generate(input_ids=prompts[:-1], sampling_params=greedy)
            second = engine.generate(input_ids=prompts[-1], sampling_params=greedy)
            assert second["meta_info"]["cached_tokens"] >= 60
            outputs[backend] = [o["output_ids"] for o in first] + [second["output_ids"]]
            engine.scheduler.check_invariants()
        finally:
            engine.shutdown()
    for backend, tokens in outputs.items():
        assert len({tuple(o) for o in tokens}) == len(prompts), f"{backend}: one degenerate answer for all"
    return outputs
