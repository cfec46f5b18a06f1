"""The fused CPU elementwise kernels (``kernels/cpu/elementwise.cpp``) against the PyTorch
layers they replace, which are themselves checked against transformers elsewhere; then a
real-model greedy run with and without them."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import build
from runtime.layers import enable_cpu_kernels
from runtime.layers.norm import RMSNorm
from runtime.layers.rotary import RotaryEmbedding

if build.find_compiler() is None:
    pytest.skip("no C++ compiler on PATH: the CPU kernels cannot be built", allow_module_level=True)

from kernels.cpu.elementwise import argmax_rows, rms_norm, rotary_, silu_and_mul  # noqa: E402


def _agree(got: torch.Tensor, want: torch.Tensor) -> None:
    """float32: to rounding; bfloat16: nearly all elements bit-equal, the rest one step apart
    (where float32 intermediates differ in their last bits, a rounding can flip)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        return
    equal = (got == want).float().mean().item()
    assert equal > 0.98, f"only {equal:.3f} of the elements are bit-equal"
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1.6e-2)


DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("hidden", [576, 100])  # 100: the bf16 kernel's masked last 4 values
def test_rms_norm_matches_the_layer(rows, hidden, dtype):
    gen = torch.Generator().manual_seed(rows)
    norm = RMSNorm(hidden, 1e-5)
    norm.weight.data = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    x = (3 * torch.randn(rows, hidden, generator=gen)).to(dtype)
    _agree(rms_norm(x, norm.weight, norm.eps), norm(x))
    # with a skip connection: the sum in place (rounded as the layer's add) and its norm
    residual = torch.randn(x.shape, generator=gen).to(dtype)
    want, want_residual = norm(x, residual)
    ours_residual = residual.clone()
    _agree(rms_norm(x, norm.weight, norm.eps, ours_residual), want)
    assert torch.equal(ours_residual, want_residual)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,dim", [(1, 9, 3, 64), (37, 4, 4, 128), (300, 8, 2, 64)])
def test_rotary_matches_the_layer_on_views_of_a_fused_projection(tokens, heads, kv_heads, dim, dtype):
    gen = torch.Generator().manual_seed(tokens)
    rope = RotaryEmbedding(dim, 4096, 10000.0)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    positions = torch.randint(0, 4096, (tokens,), generator=gen)

    def views(t):
        q, k, _ = t.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
        return q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)

    want_q, want_k = rope(positions, *views(qkv))
    fused = qkv.clone()
    q, k = views(fused)
    rotary_(q, k, positions, rope.cos, rope.sin)
    _agree(q, want_q)
    _agree(k, want_k)
    torch.testing.assert_close(fused[:, (heads + kv_heads) * dim :], qkv[:, (heads + kv_heads) * dim :])  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_silu_and_mul_matches_the_layer(rows, dtype):
    gen = torch.Generator().manual_seed(rows)
    gate_up = (4 * torch.randn(rows, 2 * 1536, generator=gen)).to(dtype)
    gate, up = gate_up.split(1536, dim=-1)
    _agree(silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up)


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
    assert enable_cpu_kernels(model) == 2 * 3 + 1 + 1
    assert model.norm.use_cpu_kernels and model.layers[1].mlp.use_cpu_kernels
    assert not RMSNorm(4, 1e-5).use_cpu_kernels  # a class default, never switched globally
