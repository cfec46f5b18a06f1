"""Linear layers with oneDNN-packed weights (``kernels/cpu/packed_linear.py``) against
``F.linear`` on the plain weight: the same bits in bfloat16, within GEMM rounding in float32."""

from __future__ import annotations

import copy
import os
import platform
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import kernels.cpu.packed_linear as pl
from kernels.cpu.packed_linear import PackedLinearUnavailable, pack_weight, packed_linear
from runtime.layers import pack_linear_weights
from runtime.layers.linear import Linear, MergedLinear, RowParallelLinear
from runtime.models.config import ModelConfig
from runtime.models.llama import LlamaForCausalLM

try:
    pl.check_packing_available(torch.float32)
except PackedLinearUnavailable as err:
    pytest.skip(f"no oneDNN packing in this PyTorch build: {err}", allow_module_level=True)


def _skip_unless_packable(dtype: torch.dtype) -> None:
    try:
        pl.check_packing_available(dtype)
    except PackedLinearUnavailable as err:
        pytest.skip(str(err))


def _agree(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    if ref.dtype == torch.bfloat16:
        assert torch.equal(ours, ref)
    else:
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [0, 1, 7, 33])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_matches_f_linear(dtype, rows, with_bias):
    _skip_unless_packable(dtype)
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(200, 96, generator=gen).to(dtype)
    bias = torch.randn(200, generator=gen).to(dtype) if with_bias else None
    x = torch.randn(rows, 96, generator=gen).to(dtype)
    _agree(packed_linear(x, pack_weight(weight), bias), F.linear(x, weight, bias))


def test_strided_input_is_read_correctly():
    _skip_unless_packable(torch.bfloat16)
    weight = torch.randn(64, 32, dtype=torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)[:, :32]  # every row starts 64 apart
    _agree(packed_linear(x, pack_weight(weight)), F.linear(x, weight))


@pytest.mark.parametrize("layer", ["linear", "merged", "row_parallel"])
def test_pack_for_cpu_keeps_the_output_and_frees_the_plain_weight(layer):
    _skip_unless_packable(torch.bfloat16)
    torch.manual_seed(0)
    module = {
        "linear": lambda: Linear(48, 80, bias=True),
        "merged": lambda: MergedLinear(48, {"a": 32, "b": 48}, bias=False),
        "row_parallel": lambda: RowParallelLinear(48, 80),
    }[layer]().to(torch.bfloat16)
    x = torch.randn(6, 48, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = module(x)
        assert module.pack_for_cpu()
        assert not module.pack_for_cpu()  # a second call is a no-op
        _agree(module(x), ref)
    assert module.weight is None and "weight" not in dict(module.named_parameters())


@pytest.mark.parametrize("tied", [True, False])
def test_model_with_packed_weights_gives_the_same_hidden_states_and_logits(tied):
    _skip_unless_packable(torch.bfloat16)
    cfg = ModelConfig.from_hf(dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=96,
                                   num_hidden_layers=2, vocab_size=300, max_position_embeddings=32, rms_norm_eps=1e-5,
                                   tie_word_embeddings=tied))
    torch.manual_seed(0)
    plain = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    packed = copy.deepcopy(plain)
    # 2 layers x (qkv, o, gate_up, down), and the head (the model's tied copy, or lm_head)
    assert pack_linear_weights(packed, torch.bfloat16) == 2 * 4 + 1
    assert pack_linear_weights(packed, torch.bfloat16) == 0  # already packed
    assert packed.embed_tokens.weight is not None  # the embedding keeps its plain table
    hidden = torch.randn(9, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        _agree(packed.compute_logits(hidden), plain.compute_logits(hidden))
        for ours, ref in zip(packed.layers, plain.layers, strict=True):
            _agree(ours.mlp(hidden), ref.mlp(hidden))
            _agree(ours.self_attn.qkv_proj(hidden), ref.self_attn.qkv_proj(hidden))


def test_bad_inputs_raise():
    packed = pack_weight(torch.randn(8, 4))
    with pytest.raises(ValueError, match="does not fit"):
        packed_linear(torch.randn(2, 5), packed)
    with pytest.raises(ValueError, match="does not fit"):
        packed_linear(torch.randn(2, 4, dtype=torch.bfloat16), packed)
    with pytest.raises(ValueError, match="2-D"):
        pack_weight(torch.randn(8))
    with pytest.raises(ValueError, match="2-D"):
        pack_weight(torch.randn(8, 4, dtype=torch.float16))


def test_a_build_without_onednn_says_so(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    pl._ops.cache_clear()
    pl.check_packing_available.cache_clear()
    try:
        with pytest.raises(PackedLinearUnavailable, match="oneDNN"):
            pack_linear_weights(torch.nn.Sequential(Linear(4, 4)), torch.float32)
    finally:
        monkeypatch.undo()
        pl._ops.cache_clear()
        pl.check_packing_available.cache_clear()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN's ISA cap is x86 only")
def test_a_cpu_without_bf16_packing_says_so_before_touching_the_model():
    """oneDNN capped at AVX2 (as on CPUs without AVX-512) refuses bfloat16 packing: the check
    says so before any layer is packed, and float32 still packs."""
    script = (
        "import torch\n"
        "from kernels.cpu.packed_linear import PackedLinearUnavailable\n"
        "from runtime.layers import pack_linear_weights\n"
        "from runtime.layers.linear import Linear\n"
        "model = torch.nn.Sequential(Linear(16, 16)).to(torch.bfloat16)\n"
        "try:\n"
        "    pack_linear_weights(model, torch.bfloat16)\n"
        "except PackedLinearUnavailable as err:\n"
        "    assert 'cannot pack' in str(err), err\n"
        "else:\n"
        "    raise SystemExit('bf16 packing did not fail')\n"
        "assert model[0].weight is not None and model[0].packed_weight is None\n"
        "assert pack_linear_weights(model.float(), torch.float32) == 1\n"
        "print('ok')\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
