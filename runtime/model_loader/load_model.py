"""Build a model from an HF-style folder and load its weights, this rank's slice of each."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from runtime.distributed import NO_TP, TPInfo
from runtime.model_loader.weights import iter_safetensors, load_hf_config
from runtime.models.config import ModelConfig
from runtime.models.llama import LlamaForCausalLM


def load_model(
    folder: Path, dtype: torch.dtype, device: str, tp: TPInfo = NO_TP
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """The model with this rank's slice of every sharded weight (all of them at TP=1)."""
    cfg = ModelConfig.from_hf(load_hf_config(folder))
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, tp).to(dtype)
    # Fresh CPU tensors of the meta shapes: Module.to_empty's empty_like of a meta tensor goes
    # through torch's Python reference ops, whose import (sympy) costs ~0.5 s of every start.
    model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu"))
    # Buffers (rotary tables) are not in checkpoints; compute them for real after the meta build.
    model.layers[0].self_attn.rotary.rebuild("cpu")
    _load_weights(model, iter_safetensors(folder))
    model = model.to(device).eval()
    model.requires_grad_(False)
    return model, cfg


def _load_weights(model: LlamaForCausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for ckpt_name, tensor in weights:
        if any(ckpt_name.endswith(s) for s in model.ignored_weights):
            continue
        if ckpt_name == "lm_head.weight" and model.lm_head is None:
            continue  # tied: the embedding is the head
        name, shard = model.checkpoint_name_map(ckpt_name)
        if name not in params:
            raise ValueError(f"checkpoint tensor {ckpt_name!r} has no place in {type(model).__name__}")
        module_path, param_name = name.rsplit(".", 1) if "." in name else ("", name)
        module = model.get_submodule(module_path)
        if shard is None and hasattr(module, "load_weight"):  # takes its own slice
            module.load_weight(param_name, tensor)
            loaded.add(name)
        elif shard is None:
            if params[name].shape != tensor.shape:
                raise ValueError(f"{ckpt_name}: shape {tuple(tensor.shape)} != expected {tuple(params[name].shape)}")
            with torch.no_grad():
                params[name].copy_(tensor)
            loaded.add(name)
        else:
            module.load_shard(shard, param_name, tensor)
            loaded.add(f"{name}:{shard}")
    expected = set()
    for name, module in model.named_modules():
        for pname, _ in module.named_parameters(recurse=False):
            full = f"{name}.{pname}" if name else pname
            offsets = getattr(module, "shard_offsets", None)
            expected.update({f"{full}:{s}" for s in offsets} if offsets else {full})
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")
