"""Build a stand-in for the default model: SmolLM2-135M-Instruct's config and tokenizer with
seeded random weights, saved as an HF folder (bfloat16 safetensors).

Why: the default model's GGUF (98 MB) cannot travel to a GPU machine that is reached only
with a 64 MiB working tree and has no package registry. Speed does not depend on the weight
values, so the benchmark's figures hold for the real model; the backend-agreement tests
need only a model whose greedy choices are clear-cut, which these weights give: linear
layers drawn with variance 1/fan_in keep activations O(1) through the 30 layers, and unit
embeddings (tied to the LM head) spread the logits over several nats.

Usage: python scripts/gpu/make_standin_model.py SHAPE_DIR OUT_DIR
(``SHAPE_DIR`` holds config.json, generation_config.json and the tokenizer files.)
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

SHAPE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_standin(shape_dir: Path, out_dir: Path, seed: int = 0) -> Path:
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(shape_dir)
    # Drawn on the CPU from one seeded generator, in parameter order, whatever the machine
    # has: CUDA's generator gives other numbers, and transformers' own init varies by version.
    with torch.device("cpu"):
        model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=param.dtype)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * noise)
            elif "embed_tokens" in name or name == "lm_head.weight":
                param.copy_(noise)
            else:
                param.copy_(noise * param.shape[-1] ** -0.5)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    for name in SHAPE_FILES:
        if (shape_dir / name).is_file():
            shutil.copy(shape_dir / name, out_dir / name)
    (out_dir / "STANDIN.txt").write_text(
        f"Random weights (seed {seed}) in the shape of {shape_dir.name}; not a trained model.\n"
    )
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_standin(args.shape_dir, args.out_dir, args.seed))


if __name__ == "__main__":
    main()
