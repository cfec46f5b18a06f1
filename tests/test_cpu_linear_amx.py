"""The AMX bfloat16 GEMM (``kernels/cpu/linear_amx.cpp``): its row blocks against the float64
product, and the MLP's gate-up product with SiLU on its tiles against the two steps it
replaces, bit for bit. Skipped without AMX tiles; ``tests/test_amx_emulated.py`` runs them on
emulated tiles elsewhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu import build, gemm_choice, linear_bf16
from tests.gemm_checks import close_to_exact, skip_without_bf16_kernel


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 31, 32, 33, 40, 48, 49, 95, 450])
@pytest.mark.parametrize("in_features", [32, 577])
def test_amx_kernel_row_blocks(rows, in_features):
    """The AMX kernel's row handling: one padded tile (< 16 rows), a padded pair of tiles
    (< 32), whole 32-row blocks, a last block of one tile row (33, 40: overlapping the block
    before it; 48: not) or two (49, 95: overlapping), and more rows than one pass over the
    weights keeps in L2 (577 inputs: 416 rows a pass), read in place (32 inputs) or from a
    zero-padded copy (577); inputs strided, with a bias, over three panels (each block asks
    for the next panel ahead, the last one for none)."""
    skip_without_bf16_kernel("amx")
    gen = torch.Generator().manual_seed(rows + in_features)
    weight = torch.randn(70, in_features, generator=gen).bfloat16()
    bias = torch.randn(70, generator=gen).bfloat16()
    x = torch.randn(rows, in_features + 3, generator=gen).bfloat16()[:, 3:]
    with gemm_choice.forced("amx"):
        close_to_exact(linear_bf16.linear(x, linear_bf16.pack(weight), 70, bias), x, weight, bias)


def _fused_silu_mul(entry: str, x: torch.Tensor, packed: torch.Tensor, width: int) -> tuple[int, torch.Tensor]:
    """``entry`` (``linear_amx_silu_mul`` or ``linear_bf16_silu_mul``) on ``x``: its status and
    its output (NaN where it wrote nothing)."""
    out = torch.full((x.shape[0], width), float("nan"), dtype=torch.bfloat16)
    status = getattr(build.load_kernels(), entry)(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0),
                                                  packed.data_ptr(), width, out.data_ptr(), width,
                                                  torch.get_num_threads())
    return status, out


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 32, 33, 40, 48, 95, 450])
@pytest.mark.parametrize("in_features", [32, 577])
@pytest.mark.parametrize("width", [32, 96])
def test_amx_gate_up_with_silu_gives_the_bits_of_the_product_then_silu_and_mul(rows, in_features, width):
    """The MLP's gate-up product with silu(gate) * up applied on its tiles
    (``linear_amx_silu_mul``) against the two steps it replaces, ``linear_bf16`` on AMX then
    ``silu_and_mul``: bit for bit, over the same row blocks as above (a padded tile, padded
    pairs, whole blocks, 16- and 32-row last blocks overlapping the block before or not, two
    passes), one or three gate panels (each with its up panel, the next pair asked for
    ahead). A oneDNN product runs first, as in a server's process: oneDNN leaves the
    thread's floating-point control (MXCSR) as it wants it, and a SiLU whose bits depended on
    that differed in ~1 element of 15,000 only after one."""
    skip_without_bf16_kernel("amx")
    from kernels.cpu import elementwise

    F.linear(torch.ones(64, 64, dtype=torch.bfloat16), torch.ones(64, 64, dtype=torch.bfloat16))

    gen = torch.Generator().manual_seed(rows * 7 + in_features + width)
    weight = torch.randn(2 * width, in_features, generator=gen).bfloat16()
    x = torch.randn(rows, in_features + 3, generator=gen).bfloat16()[:, 3:]
    packed = linear_bf16.pack(weight)
    with gemm_choice.forced("amx"):
        expected = elementwise.silu_and_mul(linear_bf16.linear(x, packed, 2 * width))
        for entry in ("linear_amx_silu_mul", "linear_bf16_silu_mul"):
            status, fused = _fused_silu_mul(entry, x, packed, width)
            assert status == 0
            assert torch.equal(fused.view(torch.int16), expected.view(torch.int16)), entry


def test_the_fused_silu_declines_what_it_cannot_do():
    """A width that is not whole panels, and (``linear_bf16_silu_mul``) a product that
    linear_bf16 would not send to the tiles: status 1 and nothing written, so the caller runs
    the product and silu_and_mul itself."""
    skip_without_bf16_kernel("amx")
    packed = linear_bf16.pack(torch.randn(80, 64).bfloat16())
    x = torch.randn(40, 64).bfloat16()
    with gemm_choice.forced("amx"):
        for entry in ("linear_amx_silu_mul", "linear_bf16_silu_mul"):
            status, out = _fused_silu_mul(entry, x, packed, 40)
            assert status == 1 and out.isnan().all()
    with gemm_choice.forced("vector"):
        status, out = _fused_silu_mul("linear_bf16_silu_mul", x, linear_bf16.pack(torch.randn(64, 64).bfloat16()), 32)
        assert status == 1 and out.isnan().all()


