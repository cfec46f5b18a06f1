"""Our float32 GEMM on 4-bit affine weight blocks (``kernels/cpu/linear_q4.cpp``): which
weights it takes (what gguf's own Q4_1 quantizer and dequantizer make, nothing else), and its
products against the float64 product of the same numbers and, bit for bit, against the
float32 GEMM on the same weights (``linear_f32``: same values, same order of sums)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from kernels.cpu import linear_f32, linear_q4
from kernels.cpu import packed_linear as pl
from tests.gemm_checks import close_to_exact, skip_without_f32_kernel


def q4_1_weight(out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """A random float32 weight as gguf quantizes it to Q4_1 and dequantizes it back."""
    w = np.random.default_rng(seed).standard_normal((out_features, in_features)).astype(np.float32) * 0.05
    kind = gguf.GGMLQuantizationType.Q4_1
    back = gguf.quants.dequantize(gguf.quants.quantize(w, kind), kind)
    return torch.from_numpy(np.ascontiguousarray(back, dtype=np.float32)).reshape(out_features, in_features)


def test_the_blocks_are_found_exactly_and_nothing_else():
    weight = q4_1_weight(40, 96, 0)
    d, m, q = linear_q4.blocks_of(weight)
    assert d.shape == m.shape == (40, 3) and q.shape == (40, 3, 32) and int(q.max()) <= 15
    assert torch.equal(d.half().float(), d)
    assert torch.equal(d.unsqueeze(-1) * q.float() + m.unsqueeze(-1), weight.view(40, 3, 32))
    nudged = weight.clone()
    nudged[7, 50] = torch.nextafter(nudged[7, 50], torch.tensor(1.0))  # one value one ulp off
    assert linear_q4.blocks_of(nudged) is None
    assert linear_q4.blocks_of(torch.randn(40, 96)) is None
    assert linear_q4.blocks_of(q4_1_weight(40, 96, 1)[:, :80].contiguous()) is None  # 80 is no multiple of 32
    spoiled = weight.clone()
    spoiled[0, 0] = float("nan")
    assert linear_q4.blocks_of(spoiled) is None
    assert linear_q4.pack(torch.randn(40, 96)) is None
    assert linear_q4.blocks_of(torch.zeros(40, 0)) is None and linear_q4.blocks_of(torch.zeros(0, 64)) is None


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 8, 9, 13, 60, 200])
@pytest.mark.parametrize("out_features", [1, 15, 16, 17, 40])
def test_q4_products_equal_the_float32_kernels_bit_for_bit(out_features, rows):
    """Up to 5 rows tiles over whole panels, 6-8 rows over half panels (a masked last one),
    more rows 8 at a time (9: 8 + 1, 13: 8 + 5, 60, 200); inputs strided, with and without
    a bias."""
    skip_without_f32_kernel()
    gen = torch.Generator().manual_seed(out_features * 1000 + rows)
    weight = q4_1_weight(out_features, 576, rows)
    bias = torch.randn(out_features, generator=gen)
    x = torch.randn(rows, 579, generator=gen)[:, 3:]
    blocks, panels = linear_q4.pack(weight), linear_f32.pack(weight)
    for b in (bias, None):
        ours = linear_q4.linear(x, blocks, out_features, b)
        close_to_exact(ours, x, weight, b)
        assert torch.equal(ours, linear_f32.linear(x, panels, out_features, b))


def test_float32_panels_of_4_bit_weights_keep_their_blocks_for_few_rows(monkeypatch):
    """``pack_weight`` keeps a 4-bit weight's blocks beside its float32 panels, and
    ``packed_linear`` takes them for up to ``few_rows()`` rows, the panels above: the same
    bits either way."""
    skip_without_f32_kernel()
    monkeypatch.setattr(linear_f32, "preferred", lambda: True)
    weight = q4_1_weight(48, 64, 3)
    packed = pl.pack_weight(weight)
    assert packed.kind == "f32_panels" and packed.few_rows.numel() * 4 < weight.numel()  # under a byte a weight
    assert pl.pack_weight(torch.randn(48, 64)).few_rows is None
    calls = []
    real = linear_q4.linear
    monkeypatch.setattr(linear_q4, "linear", lambda *args, **kw: calls.append(args[0].shape) or real(*args, **kw))
    panels = linear_f32.pack(weight)
    for rows in range(1, linear_q4.few_rows() + 3):
        x = torch.randn(rows, 64)
        assert torch.equal(pl.packed_linear(x, packed), linear_f32.linear(x, panels, 48))
    assert [shape[0] for shape in calls] == list(range(1, linear_q4.few_rows() + 1))
    monkeypatch.setattr(linear_f32, "preferred", lambda: False)  # AVX-512 CPUs: float32 on oneDNN
    try:
        assert pl.pack_weight(weight).few_rows is None
    except pl.PackedLinearUnavailable as err:
        pytest.skip(str(err))


def test_bad_inputs_to_the_q4_kernel_raise():
    skip_without_f32_kernel()
    packed = linear_q4.pack(q4_1_weight(40, 64, 4))
    with pytest.raises(ValueError, match="multiple of 32"):
        linear_q4.linear(torch.randn(2, 48), packed, 40)
    with pytest.raises(ValueError, match="does not fit"):
        linear_q4.linear(torch.randn(2, 96), packed, 40)
    with pytest.raises(ValueError, match="does not fit"):
        linear_q4.linear(torch.randn(2, 64), packed, 70)
    with pytest.raises(ValueError, match="float32"):
        linear_q4.linear(torch.randn(2, 64).bfloat16(), packed, 40)
