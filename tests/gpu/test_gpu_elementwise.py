"""The fused Triton elementwise kernels compiled on a GPU, in bfloat16 and float32, against
the PyTorch layers they replace (``tests/elementwise_agreement.py``): bfloat16 results bit
for bit but for rare one-step roundings, as on the CPU."""

from __future__ import annotations

import pytest
import torch

from tests.elementwise_agreement import (
    check_rms_norm,
    check_rotary_on_views_of_a_fused_projection,
    check_silu_and_mul,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def elementwise():
    from kernels.triton import elementwise

    return elementwise


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 576), (3, 100), (64, 4096), (1000, 576)])
def test_rms_norm_matches_the_layer(elementwise, rows, hidden, dtype):
    check_rms_norm(elementwise, rows, hidden, dtype, device="cuda")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,dim", [(1, 9, 3, 64), (37, 32, 8, 128), (300, 8, 2, 64), (9, 32, 32, 80)])
def test_rotary_matches_the_layer_on_views_of_a_fused_projection(elementwise, tokens, heads, kv_heads, dim, dtype):
    check_rotary_on_views_of_a_fused_projection(elementwise, tokens, heads, kv_heads, dim, dtype, device="cuda")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", [(1, 1536), (5, 100), (40, 14336)])
def test_silu_and_mul_matches_the_layer(elementwise, rows, width, dtype):
    check_silu_and_mul(elementwise, rows, dtype, device="cuda", width=width)
