"""The fused CPU elementwise kernels (``kernels/cpu/elementwise.cpp``) against the PyTorch
layers they replace (``tests/elementwise_agreement.py``); then a real-model greedy run with
and without them."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import build
from runtime.layers import enable_fused_elementwise
from runtime.layers.norm import RMSNorm
from runtime.layers.rotary import RotaryEmbedding
from tests.elementwise_agreement import (
    check_rms_norm,
    check_rotary_on_views_of_a_fused_projection,
    check_silu_and_mul,
)

if build.find_compiler() is None:
    pytest.skip("no C++ compiler on PATH: the CPU kernels cannot be built", allow_module_level=True)

from kernels.cpu import elementwise  # noqa: E402
from kernels.cpu.elementwise import argmax_rows, rms_norm, rotary_, silu_and_mul  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("hidden", [576, 100])  # 100: the bf16 kernel's masked last 4 values
def test_rms_norm_matches_the_layer(rows, hidden, dtype):
    check_rms_norm(elementwise, rows, hidden, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,dim", [(1, 9, 3, 64), (37, 4, 4, 128), (300, 8, 2, 64)])
def test_rotary_matches_the_layer_on_views_of_a_fused_projection(tokens, heads, kv_heads, dim, dtype):
    check_rotary_on_views_of_a_fused_projection(elementwise, tokens, heads, kv_heads, dim, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_silu_and_mul_matches_the_layer(rows, dtype):
    check_silu_and_mul(elementwise, rows, dtype)


@pytest.mark.parametrize("cols", [1, 2, 63, 64, 65, 1000, 49152])
def test_argmax_rows_matches_torch_argmax_with_ties_and_nan(cols):
    """First index of the maximum on ties (few distinct values), NaN counting as the largest
    and +-inf taken as values, against ``torch.argmax``."""
    gen = torch.Generator().manual_seed(cols)
    x = torch.randint(0, 4, (40, cols), generator=gen).float()  # many ties
    x[:10] = torch.randn(10, cols, generator=gen)
    x[10, -1] = float("inf")
    x[11] = float("-inf")
    x[12, cols // 2] = float("nan")
    x[13, cols - 1] = float("nan")
    x[13, 0] = float("inf")
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
    assert torch.equal(argmax_rows(x[:1]), x[:1].argmax(dim=-1))


def test_bad_inputs_are_value_errors():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(7), 1e-5)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        rms_norm(x.double(), torch.ones(8, dtype=torch.float64), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        rms_norm(x, torch.ones(8), 1e-5, torch.zeros(2, 7))
    rope = RotaryEmbedding(8, 16, 10000.0)
    q, k = torch.randn(2, 2, 8), torch.randn(2, 1, 8)
    before = q.clone()
    for bad in ([0, 16], [-1, 3]):
        with pytest.raises(ValueError, match="positions outside"):
            rotary_(q, k, torch.tensor(bad), rope.cos, rope.sin)
    assert torch.equal(q, before)  # checked before anything was rotated
    with pytest.raises(ValueError, match="packed"):
        rotary_(q.transpose(0, 1), k, torch.tensor([0, 1]), rope.cos, rope.sin)
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.randn(2, 7))
    for bad in (torch.randn(3), torch.randn(2, 0), torch.randn(2, 3).bfloat16()):
        with pytest.raises(ValueError, match="argmax_rows"):
            argmax_rows(bad)


def test_enable_switches_the_layers_that_have_kernels():
    from runtime.models.config import ModelConfig
    from runtime.models.llama import LlamaForCausalLM

    cfg = ModelConfig.from_hf(dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=96,
                                   num_hidden_layers=2, vocab_size=50, max_position_embeddings=32, rms_norm_eps=1e-5))
    model = LlamaForCausalLM(cfg)
    # per layer two norms and one MLP, the final norm, and the one shared rotary module
    assert enable_fused_elementwise(model, elementwise) == 2 * 3 + 1 + 1
    assert model.norm.fused_ops is elementwise and model.layers[1].mlp.fused_ops is elementwise
    assert RMSNorm(4, 1e-5).fused_ops is None  # a class default, never switched globally
