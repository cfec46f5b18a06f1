"""Our float32 GEMM (``kernels/cpu/linear_f32.cpp``) against the float64 product of the same
numbers: its panels, row tiles and passes, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import linear_f32
from tests.gemm_checks import close_to_exact, skip_without_f32_kernel


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 17])
@pytest.mark.parametrize("out_features", [1, 15, 16, 17, 33])
@pytest.mark.parametrize("in_features", [0, 1, 3, 577])
def test_f32_kernel_edges_of_panels_and_row_tiles(out_features, in_features, rows):
    """Output widths around the 16-column panel (a masked last panel), input widths down to
    none (the bias alone), and the row tiles: 1-6 rows in one tile, 7 as 4 + 3, 13 as
    5 + 4 + 4, 17 as 6 + 6 + 5; inputs strided, with and without a bias."""
    skip_without_f32_kernel()
    gen = torch.Generator().manual_seed(out_features * 1000 + in_features * 10 + rows)
    weight = torch.randn(out_features, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen)
    x = torch.randn(rows, in_features + 3, generator=gen)[:, 3:]
    packed = linear_f32.pack(weight)
    close_to_exact(linear_f32.linear(x, packed, out_features, bias), x, weight, bias)
    close_to_exact(linear_f32.linear(x, packed, out_features), x, weight, None)


@pytest.mark.parametrize("rows", [53, 54, 55, 108, 200])
def test_f32_kernel_row_passes(rows):
    """Rows in passes whose inputs fill 128 KiB: 54 rows a pass for 577 features, so the
    cases end before, at and after a pass, and several passes over many panels (the
    threads' ranges and the prefetch of each range's last panel past its end)."""
    skip_without_f32_kernel()
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(16 * 9 + 5, 577, generator=gen)
    bias = torch.randn(16 * 9 + 5, generator=gen)
    x = torch.randn(rows, 580, generator=gen)[:, 3:]
    close_to_exact(linear_f32.linear(x, linear_f32.pack(weight), weight.shape[0], bias), x, weight, bias)


def test_bad_inputs_to_the_f32_kernel_raise():
    skip_without_f32_kernel()
    packed = linear_f32.pack(torch.randn(40, 6))
    with pytest.raises(ValueError, match="does not fit"):
        linear_f32.linear(torch.randn(2, 7), packed, 40)
    with pytest.raises(ValueError, match="does not fit"):
        linear_f32.linear(torch.randn(2, 6), packed, 70)
    with pytest.raises(ValueError, match="bias"):
        linear_f32.linear(torch.randn(2, 6), packed, 40, torch.zeros(39))
    with pytest.raises(ValueError, match="float32"):
        linear_f32.linear(torch.randn(2, 6).bfloat16(), packed, 40)
    with pytest.raises(ValueError, match="float32"):
        linear_f32.pack(torch.randn(40, 6).bfloat16())


