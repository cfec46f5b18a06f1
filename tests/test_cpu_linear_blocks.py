"""Our float32 GEMM on quantized weight blocks (``kernels/cpu/linear_blocks.cpp``), both
forms: which weights each takes (what gguf's own quantizer and dequantizer make of its
format, nothing else), and its products against the float64 product of the same numbers
and, bit for bit, against the float32 GEMM on the same weights (``linear_f32``: same values,
same order of sums)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.cpu import linear_f32
from kernels.cpu import packed_linear as pl
from kernels.cpu.linear_blocks import FORMS, Q4_1, Q8_0
from tests.gemm_checks import close_to_exact, gguf_weight, skip_without_f32_kernel

# Each form and the gguf quantization type whose values it holds.
GGUF_TYPES = {"q4_1": "Q4_1", "q8_0": "Q8_0"}
forms = pytest.mark.parametrize("name", list(FORMS))


def test_the_4_bit_blocks_are_found_exactly():
    weight = gguf_weight("Q4_1", 40, 96, 0)
    (d, m), q = Q4_1.blocks_of(weight)
    assert d.shape == m.shape == (40, 3) and q.shape == (40, 3, 32) and int(q.max()) <= 15
    assert torch.equal(d.half().float(), d)
    assert torch.equal(d.unsqueeze(-1) * q.float() + m.unsqueeze(-1), weight.view(40, 3, 32))


def test_the_8_bit_blocks_are_found_exactly():
    weight = gguf_weight("Q8_0", 40, 96, 0)
    (d,), q = Q8_0.blocks_of(weight)
    assert d.shape == (40, 3) and q.shape == (40, 3, 32) and q.dtype == torch.int8
    assert torch.equal(d.half().float(), d)
    assert torch.equal(d.unsqueeze(-1) * q.float(), weight.view(40, 3, 32))
    assert torch.equal(q.abs().amax(-1), torch.full((40, 3), 127, dtype=torch.int8))  # how Q8_0 scales
    zeros = torch.zeros(16, 64)
    assert torch.equal(Q8_0.blocks_of(zeros)[1], torch.zeros(16, 2, 32, dtype=torch.int8))
    assert Q8_0.blocks_of(-zeros) is None  # d * 0 is +0: a -0 is not given back


def not_taken(name: str, weight: torch.Tensor) -> bool:
    """Neither the reference (``blocks_of``) nor the compiled packing takes ``weight``."""
    form = FORMS[name]
    return form.blocks_of(weight) is None and form.pack(weight) is None


@forms
def test_nothing_else_is_taken_for_blocks(name):
    form = FORMS[name]
    weight = gguf_weight(GGUF_TYPES[name], 40, 96, 0)
    for row, col in ((7, 50), (0, 0), (39, 95)):  # one value one ulp off: first, middle, last panel
        nudged = weight.clone()
        nudged[row, col] = torch.nextafter(nudged[row, col], torch.tensor(1.0))
        assert not_taken(name, nudged)
    assert not_taken(name, torch.randn(40, 96))
    for other, kind in GGUF_TYPES.items():  # the other form's blocks are not these
        assert (form.blocks_of(gguf_weight(kind, 40, 96, 1)) is None) == (other != name)
        assert (form.pack(gguf_weight(kind, 40, 96, 1)) is None) == (other != name)
    assert not_taken(name, weight[:, :80].contiguous())  # 80 is no multiple of 32
    for bad in (float("nan"), float("inf"), float("-inf")):
        spoiled = weight.clone()
        spoiled[33, 3] = bad
        assert not_taken(name, spoiled)
    assert not_taken(name, torch.zeros(40, 0)) and not_taken(name, torch.zeros(0, 64))


@forms
@pytest.mark.parametrize("shape", [(1, 32), (15, 64), (16, 96), (17, 576), (100, 160)])
def test_the_compiled_packing_is_the_references_byte_for_byte(name, shape):
    form = FORMS[name]
    weight = gguf_weight(GGUF_TYPES[name], *shape, seed=shape[0])
    fast, reference = form.pack(weight), form.pack_reference(weight)
    assert fast is not None and reference is not None
    assert torch.equal(fast.view(torch.int32), reference.view(torch.int32))
    assert torch.equal(form.pack(weight.t().contiguous().t()).view(torch.int32), reference.view(torch.int32))


def test_a_library_that_cannot_pack_leaves_it_to_the_reference(monkeypatch):
    """A build without F16C answers 3 from ``linear_blocks_pack``: ``pack`` then packs in
    PyTorch, to the same bytes."""
    from kernels.cpu.build import load_kernels

    weight = gguf_weight("Q4_1", 20, 64, 5)
    expected = Q4_1.pack_reference(weight)
    monkeypatch.setattr(load_kernels(), "linear_blocks_pack", lambda *args: 3)
    assert torch.equal(Q4_1.pack(weight).view(torch.int32), expected.view(torch.int32))
    assert Q4_1.pack(torch.randn(20, 64)) is None
    with pytest.raises(ValueError, match="float32"):
        Q4_1.pack(weight.bfloat16())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(list(GGUF_TYPES)), st.integers(-14, 4))
def test_the_compiled_packing_takes_whatever_the_reference_takes(seed, name, log_scale):
    """Blocks made as the quantizers make them (each block's integers spanning the whole
    range, so its scale is the quantizer's), scales over many magnitudes: wherever the
    reference finds the blocks, the compiled packing finds them too, to the same bytes
    (compiled with -ffast-math, it may divide by multiplying with a reciprocal)."""
    form = FORMS[name]
    gen = torch.Generator().manual_seed(seed)
    rows, blocks = 16, 4
    d = (torch.rand(rows, blocks, 1, generator=gen) + 0.5) * 2.0**log_scale
    d = d.half().float()
    if form is Q4_1:
        q = torch.randint(0, 16, (rows, blocks, 32), generator=gen).float()
        q[..., 0], q[..., 1] = 0, 15
        m = -8 * d + torch.randn(rows, blocks, 1, generator=gen) * d
        weight = (d * q + m).reshape(rows, blocks * 32)
    else:
        q = torch.randint(-127, 128, (rows, blocks, 32), generator=gen).float()
        q[..., 0] = 127 * torch.sign(torch.randn(rows, blocks, generator=gen))
        weight = (d * q).reshape(rows, blocks * 32)
    reference = form.pack_reference(weight)
    fast = form.pack(weight)
    if reference is not None:
        assert fast is not None
        assert torch.equal(fast.view(torch.int32), reference.view(torch.int32))


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 8, 9, 13, 60, 200])
@pytest.mark.parametrize("out_features", [1, 15, 16, 17, 40])
@forms
def test_products_equal_the_float32_kernels_bit_for_bit(name, out_features, rows):
    """Up to 5 rows tiles over whole panels, 6-8 rows over half panels (a masked last one),
    more rows 8 at a time (9: 8 + 1, 13: 8 + 5, 60, 200); inputs strided, with and without
    a bias; the 8-bit form with a block of both extreme steps, -127 and 127."""
    skip_without_f32_kernel()
    form = FORMS[name]
    gen = torch.Generator().manual_seed(out_features * 1000 + rows)
    weight = gguf_weight(GGUF_TYPES[name], out_features, 576, rows)
    if form is Q8_0:
        weight[:, 64:96] = torch.linspace(-127, 127, 32).round() * 2.0**-10
    bias = torch.randn(out_features, generator=gen)
    x = torch.randn(rows, 579, generator=gen)[:, 3:]
    blocks, panels = form.pack(weight), linear_f32.pack(weight)
    assert blocks is not None
    for b in (bias, None):
        ours = form.linear(x, blocks, out_features, b)
        close_to_exact(ours, x, weight, b)
        assert torch.equal(ours, linear_f32.linear(x, panels, out_features, b))


@forms
def test_float32_panels_of_block_weights_keep_their_blocks_for_few_rows(name, monkeypatch):
    """``pack_weight`` keeps a weight's blocks beside its float32 panels (the default model's
    layers are 4-bit blocks, its tied output layer 8-bit ones), and ``packed_linear`` takes
    them for up to ``few_rows()`` rows, the panels above: the same bits either way."""
    skip_without_f32_kernel()
    monkeypatch.setattr(linear_f32, "preferred", lambda: True)
    form = FORMS[name]
    weight = gguf_weight(GGUF_TYPES[name], 48, 64, 3)
    packed = pl.pack_weight(weight)
    assert packed.kind == "f32_panels" and packed.blocks == name
    assert packed.few_rows.numel() < 0.3 * weight.numel()  # 6 bits or 1.125 bytes a weight, not 4 bytes
    assert pl.pack_weight(torch.randn(48, 64)).few_rows is None
    calls = []
    real = form.linear
    monkeypatch.setattr(form, "linear", lambda *args, **kw: calls.append(args[0].shape) or real(*args, **kw))
    panels = linear_f32.pack(weight)
    for rows in range(1, form.few_rows() + 3):
        x = torch.randn(rows, 64)
        assert torch.equal(pl.packed_linear(x, packed), linear_f32.linear(x, panels, 48))
    assert [shape[0] for shape in calls] == list(range(1, form.few_rows() + 1))
    monkeypatch.setattr(linear_f32, "preferred", lambda: False)  # AVX-512 CPUs: float32 on oneDNN
    try:
        assert pl.pack_weight(weight).few_rows is None
    except pl.PackedLinearUnavailable as err:
        pytest.skip(str(err))


@forms
def test_bad_inputs_to_the_kernel_raise(name):
    skip_without_f32_kernel()
    form = FORMS[name]
    packed = form.pack(gguf_weight(GGUF_TYPES[name], 40, 64, 4))
    with pytest.raises(ValueError, match="multiple of 32"):
        form.linear(torch.randn(2, 48), packed, 40)
    with pytest.raises(ValueError, match="does not fit"):
        form.linear(torch.randn(2, 96), packed, 40)
    with pytest.raises(ValueError, match="does not fit"):
        form.linear(torch.randn(2, 64), packed, 70)
    with pytest.raises(ValueError, match="float32"):
        form.linear(torch.randn(2, 64).bfloat16(), packed, 40)


def test_the_worker_names_the_block_forms_it_keeps():
    """The ready line's GEMM words (``_choose_gemm``) count the weights kept in each form."""
    from types import SimpleNamespace

    from runtime.executor.worker import _block_forms_in_words

    weights = [SimpleNamespace(blocks="q4_1")] * 120 + [SimpleNamespace(blocks="q8_0")]
    assert _block_forms_in_words(weights) == (
        f"; 120 of 121 weights also as q4_1 blocks (up to {Q4_1.few_rows()} rows), "
        f"1 as q8_0 blocks (up to {Q8_0.few_rows()} rows)")
    assert _block_forms_in_words([SimpleNamespace(blocks=None), SimpleNamespace(blocks="q8_0")]) == (
        f"; 1 of 2 weights also as q8_0 blocks (up to {Q8_0.few_rows()} rows)")
    assert _block_forms_in_words([SimpleNamespace(blocks=None)]) == ""
