"""Linear layers with packed weights (``kernels/cpu/packed_linear.py``): our bfloat16 GEMM
(``linear_bf16.cpp``), our float32 GEMM (``linear_f32.cpp``) and oneDNN's packing, each against
the float64 product of the same numbers; the layers and models that use them against their
plain ``F.linear`` selves. The float32 kernel's own edges are in ``test_cpu_linear_f32.py``,
the AMX kernel's row blocks and fused SiLU in ``test_cpu_linear_amx.py``."""

from __future__ import annotations

import contextlib
import copy
import os
import platform
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import kernels.cpu.packed_linear as pl
from kernels.cpu import build, gemm_choice, gemm_entry, linear_bf16, linear_f32
from kernels.cpu.packed_linear import PackedLinearUnavailable, pack_weight, packed_linear
from runtime.layers import pack_linear_weights
from runtime.layers.linear import Linear, MergedLinear, RowParallelLinear
from runtime.models.config import ModelConfig
from runtime.models.llama import LlamaForCausalLM
from tests.gemm_checks import close_to_exact, skip_without_bf16_kernel, skip_without_f32_kernel

# (dtype, packed form, bf16 kernel): every form pack_weight may choose, and for our bf16
# packing each kernel that may multiply it (gemm_choice picks by row count).
FORMS = [(torch.float32, "onednn", None), (torch.float32, "f32_panels", None), (torch.bfloat16, "onednn", None),
         (torch.bfloat16, "bf16_panels", "vector"),
         (torch.bfloat16, "bf16_panels", "widened"), (torch.bfloat16, "bf16_panels", "amx")]


@pytest.fixture(params=FORMS, ids=lambda f: "-".join(x for x in (str(f[0]).removeprefix("torch."), f[1], f[2]) if x))
def form(request, monkeypatch):
    """Make ``pack_weight`` use this form (and the bf16 GEMM this kernel) here, or skip
    where it cannot."""
    dtype, kind, kernel = request.param
    skip_without_bf16_kernel(kernel)
    if kind == "f32_panels":
        skip_without_f32_kernel()
    # On AVX-512 CPUs float32 goes to oneDNN by default; our kernel is checked there too.
    monkeypatch.setattr(linear_f32, "preferred", lambda: kind == "f32_panels")
    if kind == "onednn":
        monkeypatch.setattr(linear_bf16, "available", lambda: False)
    try:
        assert pl.kind_for(dtype) == kind
    except PackedLinearUnavailable as err:
        pytest.skip(str(err))
    with gemm_choice.forced(kernel) if kernel else contextlib.nullcontext():
        yield dtype, kind


@pytest.mark.parametrize("rows", [0, 1, 7, 12, 13, 33, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_is_the_exact_product_rounded(form, rows, with_bias):
    dtype, _ = form
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(200, 96, generator=gen).to(dtype)
    bias = torch.randn(200, generator=gen).to(dtype) if with_bias else None
    x = torch.randn(rows, 96, generator=gen).to(dtype)
    packed = pack_weight(weight)
    assert packed.kind == form[1]
    close_to_exact(packed_linear(x, packed, bias), x, weight, bias)


@pytest.mark.parametrize("kernel", gemm_choice.KERNELS)
@pytest.mark.parametrize("out_features", [1, 31, 32, 33, 65])
@pytest.mark.parametrize("in_features", [0, 1, 2, 3, 40, 64, 577])
def test_bf16_kernel_edges_of_panels_and_pairs(out_features, in_features, kernel):
    """Output widths around the 32-column panel, odd input widths (a half-empty pair, a
    part-filled AMX tile), 40 inputs (one 16-pair block of the input regrouping and 4 pairs
    after it) and no inputs at all (the bias alone)."""
    skip_without_bf16_kernel(kernel)
    gen = torch.Generator().manual_seed(out_features * 1000 + in_features)
    weight = torch.randn(out_features, in_features, generator=gen).bfloat16()
    bias = torch.randn(out_features, generator=gen).bfloat16()
    x = torch.randn(14, in_features, generator=gen).bfloat16()
    packed = linear_bf16.pack(weight)
    with gemm_choice.forced(kernel):
        close_to_exact(linear_bf16.linear(x, packed, out_features, bias), x, weight, bias)
        close_to_exact(linear_bf16.linear(x[:5], packed, out_features), x[:5], weight, None)


@pytest.mark.parametrize("rows", [1, 12, 13, 16, 107, 108, 109, 450])
def test_widened_kernel_row_tiles_and_passes(rows):
    """The widened kernel's rows: a tile of 1, a full tile of 12, 13 and 16 split into two
    tiles, and passes of 108 rows (its float32 inputs for 577 features fill 256 KiB at 113
    rows) ending before, at and after a pass; inputs strided, with a bias."""
    skip_without_bf16_kernel("widened")
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(70, 577, generator=gen).bfloat16()
    bias = torch.randn(70, generator=gen).bfloat16()
    x = torch.randn(rows, 580, generator=gen).bfloat16()[:, 3:]
    with gemm_choice.forced("widened"):
        close_to_exact(linear_bf16.linear(x, linear_bf16.pack(weight), 70, bias), x, weight, bias)


@pytest.mark.parametrize("panels_ahead", [1, 3])
@pytest.mark.parametrize("rows", [1, 2, 7, 8])
def test_the_vector_kernels_small_row_prefetch_changes_no_bit(rows, panels_ahead):
    """Prefetching a panel ahead below 8 rows (chosen by measurement, gemm_choice) reads the
    same weights: the result is the exact product rounded, and bit-equal to no prefetch,
    including for the last panels of each thread's range, whose prefetch target is past it."""
    skip_without_bf16_kernel("vector")
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(7 * 32 + 5, 577, generator=gen).bfloat16()
    x = torch.randn(rows, 577, generator=gen).bfloat16()
    packed = linear_bf16.pack(weight)
    with gemm_choice.forced("vector"):
        previous = gemm_choice.set_small_prefetch(0)
        try:
            plain = linear_bf16.linear(x, packed, weight.shape[0])
            gemm_choice.set_small_prefetch(panels_ahead)
            ours = linear_bf16.linear(x, packed, weight.shape[0])
        finally:
            gemm_choice.set_small_prefetch(previous)
    close_to_exact(ours, x, weight, None)
    assert torch.equal(ours, plain)


def test_the_row_threshold_picks_the_kernel():
    """``linear_bf16`` sends products of at least the threshold's rows to the AMX kernel and
    smaller ones to the vector kernel: each result equals that kernel's own, bit for bit.
    The two kernels add the same products in the same order and agree almost everywhere, so
    the check uses rows of widely scaled inputs on which they round differently."""
    skip_without_bf16_kernel("amx")
    lib = build.load_kernels()
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(96, 1536, generator=gen).bfloat16()
    packed = linear_bf16.pack(weight)

    def run(entry: str, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], 96, dtype=torch.bfloat16)
        assert getattr(lib, entry)(x.data_ptr(), x.shape[0], 1536, 1536, packed.data_ptr(), 96, None,
                                   out.data_ptr(), 96, 2) == 0
        return out

    many = (torch.randn(300, 1536, generator=gen) * torch.logspace(-3, 3, 1536)).bfloat16()
    differs = (run("linear_amx", many) != run("linear_bf16_vector", many)).any(dim=1).nonzero().flatten()
    assert differs.numel() > 0
    previous = gemm_choice.set_amx_min_rows(6)
    try:
        for rows in (5, 6, 40):
            x = many[differs[0]].expand(rows, 1536).contiguous()
            amx, vector = run("linear_amx", x), run("linear_bf16_vector", x)
            assert not torch.equal(amx, vector)
            assert torch.equal(linear_bf16.linear(x, packed, 96), amx if rows >= 6 else vector)
    finally:
        gemm_choice.set_amx_min_rows(previous)


def test_the_widen_threshold_picks_the_widened_kernel():
    """Below the AMX threshold, products of at least the widen threshold's rows go to the
    widened (float32 FMA) tiles and smaller ones to vdpbf16ps: each result equals that
    kernel's own. The two add the same products in the same order, so the check uses a
    subnormal input, which vdpbf16ps reads as zero and an FMA multiplies (by 2^100 here)."""
    skip_without_bf16_kernel("widened")
    weight = torch.zeros(96, 64)
    weight[:, 0] = 2.0**100
    packed = linear_bf16.pack(weight.bfloat16())

    def run(kernel: str, x: torch.Tensor) -> torch.Tensor:
        with gemm_choice.forced(kernel):
            return linear_bf16.linear(x, packed, 96)

    with gemm_choice.forced("vector"):
        gemm_choice.set_widen_min_rows(6)
        for rows in (5, 6, 40):
            x = torch.zeros(rows, 64, dtype=torch.bfloat16)
            x[:, 0] = 1e-39  # subnormal in bf16 and float32
            widened, vector = run("widened", x), run("vector", x)
            if not torch.equal(vector, torch.zeros_like(vector)):
                pytest.skip("this CPU's vdpbf16ps multiplies subnormal inputs: nothing tells the kernels apart")
            assert torch.allclose(widened.float(), torch.full_like(widened.float(), 1e-39 * 2.0**100), rtol=1e-2)
            assert torch.equal(linear_bf16.linear(x, packed, 96), widened if rows >= 6 else vector)


def test_strided_and_batched_inputs_are_read_correctly(form):
    dtype, _ = form
    weight = torch.randn(64, 32).to(dtype)
    x = torch.randn(5, 64).to(dtype)[:, :32]  # every row starts 64 apart
    close_to_exact(packed_linear(x, pack_weight(weight)), x, weight, None)
    x3 = torch.randn(2, 3, 32).to(dtype)
    out = packed_linear(x3, pack_weight(weight))
    assert out.shape == (2, 3, 64)
    close_to_exact(out.reshape(6, 64), x3.reshape(6, 32), weight, None)


def _agree(ours: torch.Tensor, ref: torch.Tensor, kind: str) -> None:
    """A layer on packed weights against the same layer on ``F.linear``: oneDNN's bfloat16
    equals it bit for bit; float32 and our kernel differ where the sums round differently."""
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    if ref.dtype == torch.bfloat16 and kind == "onednn":
        assert torch.equal(ours, ref)
    elif ref.dtype == torch.bfloat16:
        torch.testing.assert_close(ours, ref, rtol=2**-6, atol=ref.abs().max().item() * 2**-6)
    else:
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", ["linear", "merged", "row_parallel"])
def test_pack_for_cpu_keeps_the_output_and_frees_the_plain_weight(layer, form):
    dtype, kind = form
    torch.manual_seed(0)
    module = {
        "linear": lambda: Linear(48, 80, bias=True),
        "merged": lambda: MergedLinear(48, {"a": 32, "b": 48}, bias=False),
        "row_parallel": lambda: RowParallelLinear(48, 80),
    }[layer]().to(dtype)
    x = torch.randn(6, 48).to(dtype)
    with torch.no_grad():
        ref = module(x)
        assert module.pack_for_cpu()
        assert not module.pack_for_cpu()  # a second call is a no-op
        _agree(module(x), ref, kind)
    assert module.weight is None and "weight" not in dict(module.named_parameters())


@pytest.mark.parametrize("tied", [True, False])
def test_model_with_packed_weights_gives_the_same_hidden_states_and_logits(tied, form):
    dtype, kind = form
    cfg = ModelConfig.from_hf(dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=96,
                                   num_hidden_layers=2, vocab_size=300, max_position_embeddings=32, rms_norm_eps=1e-5,
                                   tie_word_embeddings=tied))
    torch.manual_seed(0)
    plain = LlamaForCausalLM(cfg).to(dtype).eval()
    packed = copy.deepcopy(plain)
    # 2 layers x (qkv, o, gate_up, down), and the head (the model's tied copy, or lm_head)
    assert pack_linear_weights(packed, dtype) == 2 * 4 + 1
    assert pack_linear_weights(packed, dtype) == 0  # already packed
    assert packed.embed_tokens.weight is not None  # the embedding keeps its plain table
    hidden = torch.randn(9, 64).to(dtype)
    with torch.no_grad():
        _agree(packed.compute_logits(hidden), plain.compute_logits(hidden), kind)
        for ours, ref in zip(packed.layers, plain.layers, strict=True):
            _agree(ours.mlp(hidden), ref.mlp(hidden), kind)
            _agree(ours.self_attn.qkv_proj(hidden), ref.self_attn.qkv_proj(hidden), kind)


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


def test_bad_inputs_to_the_bf16_kernel_raise():
    if not linear_bf16.available():
        pytest.skip("no bfloat16 GEMM kernel on this CPU")
    packed = linear_bf16.pack(torch.randn(40, 6).bfloat16())
    # Input widths are padded to whole 32-feature tiles in the packed form, so only a width
    # in another tile is visible from the packed size (PackedWeight checks the exact width).
    with pytest.raises(ValueError, match="does not fit"):
        linear_bf16.linear(torch.randn(2, 40).bfloat16(), packed, 40)
    with pytest.raises(ValueError, match="does not fit"):
        linear_bf16.linear(torch.randn(2, 6).bfloat16(), packed, 70)
    with pytest.raises(ValueError, match="bias"):
        linear_bf16.linear(torch.randn(2, 6).bfloat16(), packed, 40, torch.zeros(39).bfloat16())
    with pytest.raises(ValueError, match="bfloat16"):
        linear_bf16.linear(torch.randn(2, 6), packed, 40)
    with pytest.raises(ValueError, match="bfloat16"):
        linear_bf16.pack(torch.randn(40, 6))


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 build flags")
def test_a_build_without_avx512_bf16_has_no_kernel_and_says_so(other_kernel_builds, monkeypatch):
    if build.find_compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv("FORKSERVE_KERNEL_CACHE", str(other_kernel_builds))
    monkeypatch.delenv("FORKSERVE_AVX512_EMULATE", raising=False)  # a build without it, not emulated
    monkeypatch.setattr(build, "FLAGS", (*build.FLAGS, "-mno-avx512bf16"))
    lib = build.load_kernels.__wrapped__()
    assert lib.linear_bf16_available() == 0
    monkeypatch.setattr(linear_bf16, "load_kernels", lambda: lib)
    monkeypatch.setattr(gemm_entry, "load_kernels", lambda: lib)
    assert not linear_bf16.available()
    x = torch.randn(2, 6).bfloat16()
    with pytest.raises(build.CpuKernelsUnavailable, match="AVX512-BF16"):
        linear_bf16.linear(x, torch.zeros(lib.linear_bf16_packed_bytes(40, 6) // 2, dtype=torch.bfloat16), 40)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 build flags")
def test_a_build_without_avx2_has_no_f32_kernel_and_says_so(other_kernel_builds, monkeypatch):
    if build.find_compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv("FORKSERVE_KERNEL_CACHE", str(other_kernel_builds))
    monkeypatch.delenv("FORKSERVE_AVX512_EMULATE", raising=False)  # a build without it, not emulated
    monkeypatch.setattr(build, "FLAGS", (*build.FLAGS, "-mno-avx2", "-mno-fma"))
    lib = build.load_kernels.__wrapped__()
    assert lib.linear_f32_available() == 0
    monkeypatch.setattr(linear_f32, "load_kernels", lambda: lib)
    monkeypatch.setattr(gemm_entry, "load_kernels", lambda: lib)
    assert not linear_f32.available() and not linear_f32.preferred()
    with pytest.raises(build.CpuKernelsUnavailable, match="AVX2"):
        linear_f32.linear(torch.randn(2, 6), torch.zeros(lib.linear_f32_packed_numel(40, 6)), 40)


def test_a_build_without_onednn_says_so(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    monkeypatch.setattr(linear_f32, "preferred", lambda: False)  # float32 on oneDNN, as on AVX-512 CPUs
    pl._onednn_ops.cache_clear()
    pl._onednn_can_pack.cache_clear()
    try:
        with pytest.raises(PackedLinearUnavailable, match="oneDNN"):
            pack_linear_weights(torch.nn.Sequential(Linear(4, 4)), torch.float32)
    finally:
        monkeypatch.undo()
        pl._onednn_ops.cache_clear()
        pl._onednn_can_pack.cache_clear()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN's ISA cap is x86 only")
def test_a_cpu_without_bf16_packing_says_so_before_touching_the_model():
    """Without our bfloat16 kernel and with oneDNN capped at AVX2 (as on CPUs without
    AVX-512), bfloat16 packing is refused: the check says so before any layer is packed,
    and float32 still packs."""
    script = (
        "import torch\n"
        "from kernels.cpu import linear_bf16\n"
        "from kernels.cpu.packed_linear import PackedLinearUnavailable\n"
        "from runtime.layers import pack_linear_weights\n"
        "from runtime.layers.linear import Linear\n"
        "linear_bf16.available = lambda: False\n"
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


def test_the_plain_layer_is_the_reference():
    """``F.linear`` itself against the float64 product: the bound in ``close_to_exact``
    is tight enough to hold for it and loose enough not to flag it."""
    gen = torch.Generator().manual_seed(1)
    weight, x = torch.randn(70, 130, generator=gen).bfloat16(), torch.randn(9, 130, generator=gen).bfloat16()
    close_to_exact(F.linear(x, weight), x, weight, None)
