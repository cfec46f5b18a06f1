"""The Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2): structure only.

Shapes are flat: a step's tokens from all requests are concatenated, ``[num_tokens, ...]``;
which token belongs to which request lives in the forward context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu.packed_linear import PackedWeight, pack_weight, packed_linear
from runtime.distributed import NO_TP, TPInfo, check_tp_size, split_range
from runtime.layers.attention import RadixAttention
from runtime.layers.linear import Linear, MergedLinear, RowParallelLinear
from runtime.layers.norm import RMSNorm
from runtime.layers.rotary import RotaryEmbedding
from runtime.models.config import ModelConfig

if TYPE_CHECKING:
    from runtime.layers import FusedElementwise


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding, tp: TPInfo) -> None:
        super().__init__()
        hd = self.head_dim = cfg.head_dim
        # This rank's KV-head groups and the query heads that read them.
        kv_start, self.num_kv_heads = split_range(cfg.num_kv_heads, tp.size, tp.rank)
        group = cfg.num_heads // cfg.num_kv_heads
        q_start, self.num_heads = kv_start * group, self.num_kv_heads * group
        q_part, kv_part = (q_start * hd, self.num_heads * hd), (kv_start * hd, self.num_kv_heads * hd)
        q_size, kv_size = cfg.num_heads * hd, cfg.num_kv_heads * hd
        self.qkv_proj = MergedLinear(
            cfg.hidden_size, {"q": q_size, "k": kv_size, "v": kv_size}, cfg.qkv_bias, {"q": q_part, "k": kv_part, "v": kv_part}
        )
        self.o_proj = RowParallelLinear(q_size, cfg.hidden_size, q_part, tp)
        self.rotary = rotary
        self.attn = RadixAttention(layer_id, self.num_heads, self.num_kv_heads, hd)
        self.split = (q_part[1], kv_part[1], kv_part[1])

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        out = self.attn(q, k, v.view(-1, self.num_kv_heads, self.head_dim))
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPInfo) -> None:
        super().__init__()
        full = cfg.intermediate_size
        part = split_range(full, tp.size, tp.rank)
        self.gate_up_proj = MergedLinear(cfg.hidden_size, {"gate": full, "up": full}, bias=False, parts={"gate": part, "up": part})
        self.down_proj = RowParallelLinear(full, cfg.hidden_size, part, tp)
        self.width = part[1]

    fused_ops: FusedElementwise | None = None  # set by runtime.layers.enable_fused_elementwise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_ops is not None:
            return self.down_proj(self.fused_ops.silu_and_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).split(self.width, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding, tp: TPInfo) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, layer_id, rotary, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg, tp)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: the previous layer's output, not yet added to the skip connection
        ``residual`` (None before the first layer, where ``x`` is the embedding). Returns
        this layer's output and the skip connection so far; the caller adds the two (each
        norm does it together with its own pass)."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(positions, h), residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    # Checkpoint names that are parts of one of our fused parameters: (ours, shard).
    packed_modules: dict[str, tuple[str, str]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }
    # Checkpoint tensors that carry nothing we need (precomputed rotary tables).
    ignored_weights: tuple[str, ...] = ("rotary_emb.inv_freq",)

    def __init__(self, cfg: ModelConfig, tp: TPInfo = NO_TP) -> None:
        super().__init__()
        check_tp_size(tp.size, cfg.num_kv_heads)
        self.cfg = cfg
        # Embedding and head are replicated: at these sizes a vocab split saves little.
        # nn.Embedding's own normal_ init costs ~2 s on the meta device, where the loader builds
        # the model (its decomposition imports); there the checkpoint fills the weight. A model
        # built on a real device (random-weight tests) gets the usual N(0, 1) init, never
        # uninitialised memory.
        embedding = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if embedding.device.type != "meta":
            nn.init.normal_(embedding)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=embedding)
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i, rotary, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.packed_tied_head: PackedWeight | None = None
        # Set by the worker on the cpu backend in bfloat16: all layers as one compiled call.
        self.compiled_layers: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states after the final norm, ``[num_tokens, hidden]``."""
        x, residual = self.embed_tokens(input_ids), None
        if self.compiled_layers is not None:
            x, residual = self.compiled_layers(x, positions)
        else:
            for layer in self.layers:
                x, residual = layer(positions, x, residual)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits for the rows of ``hidden`` that need them."""
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        if self.packed_tied_head is not None:
            return packed_linear(hidden, self.packed_tied_head).float()
        return F.linear(hidden, self.embed_tokens.weight).float()

    def pack_for_cpu(self) -> bool:
        """A tied head gets its own packed copy (the embedding keeps the plain one, so the
        table is held twice); an untied ``lm_head`` is a ``Linear`` and packs itself.
        Returns whether this call packed anything."""
        if self.lm_head is not None or self.packed_tied_head is not None:
            return False
        self.packed_tied_head = pack_weight(self.embed_tokens.weight)
        return True

    @staticmethod
    def checkpoint_name_map(name: str) -> tuple[str, str | None]:
        """Map an HF checkpoint tensor name to (our parameter path, shard or None)."""
        name = name.removeprefix("model.")
        for ckpt, (ours, shard) in LlamaForCausalLM.packed_modules.items():
            if f".{ckpt}." in name:
                return name.replace(f".{ckpt}.", f".{ours}."), shard
        return name, None

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> LlamaForCausalLM:
        return cls(ModelConfig.from_hf(hf))
