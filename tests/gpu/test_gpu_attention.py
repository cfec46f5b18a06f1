"""All three backends on a GPU, in bfloat16, against the float32 brute-force reference and
against each other, on random shapes (scattered slots, cached prefixes, GQA)."""

from __future__ import annotations

import pytest
import torch

from tests.test_attention_backends import TOLERANCE, _run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BACKENDS = ["torch_native", "triton", "flashinfer"]
# (query heads, KV heads, head dim): SmolLM2's 9/3 x 64, GQA 4 x 128, MHA 128, GQA 8 x 64
GEOMETRIES = [(9, 3, 64), (32, 8, 128), (8, 8, 128), (16, 2, 64)]
EXTEND_CASES = [
    ([0], [1]),
    ([1], [1]),
    ([0, 3, 10], [4, 1, 6]),
    ([20, 0, 1, 7], [1, 9, 2, 3]),
    ([0, 12], [300, 129]),
    ([2000, 0, 5], [77, 512, 2]),
]
DECODE_CASES = [[0], [1, 15, 4, 40], [63] * 8, [4000, 3, 1500], list(range(1, 600, 9))]


def _skip_missing(backend: str) -> None:
    if backend == "flashinfer":
        pytest.importorskip("flashinfer", reason="flashinfer is not installed (pip install .[cuda])")


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("prefix_lens,extend_lens", EXTEND_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_extend_bf16(backend, prefix_lens, extend_lens, geometry):
    _skip_missing(backend)
    _run(backend, prefix_lens, extend_lens, *geometry, device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("prefix_lens", DECODE_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_bf16(backend, prefix_lens, geometry):
    _skip_missing(backend)
    _run(backend, prefix_lens, [1] * len(prefix_lens), *geometry, decode=True, device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize("decode", [False, True])
def test_triton_and_flashinfer_agree_with_torch_native(decode):
    pytest.importorskip("flashinfer", reason="flashinfer is not installed (pip install .[cuda])")
    prefix_lens, extend_lens = ([700, 0, 33, 5], [1, 1, 1, 1]) if decode else ([700, 0, 33], [40, 300, 1])
    outs = {
        b: _run(b, prefix_lens, extend_lens, 9, 3, 64, decode=decode, device="cuda", dtype=torch.bfloat16)
        for b in BACKENDS
    }
    for b in ("triton", "flashinfer"):
        torch.testing.assert_close(outs[b].float(), outs["torch_native"].float(), **TOLERANCE[torch.bfloat16])


@pytest.mark.parametrize("backend", ["torch_native", "triton"])
def test_float32_on_gpu(backend):
    """Float32 models run too; Triton's dots use TF32 on tensor cores, hence the looser bound."""
    _run(backend, [30, 0], [20, 7], 9, 3, 64, device="cuda", dtype=torch.float32, tolerance=dict(atol=5e-3, rtol=5e-3))
