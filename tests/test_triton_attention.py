"""The Triton backend against the brute-force reference and against ``torch_native``; then a
whole greedy generation through the engine.

Runs in Triton's CPU interpreter (``tests/triton_interpreter.py``), which computes
``tl.dot`` wrongly in bfloat16, so these tests are float32; bfloat16 is checked on a GPU by
``tests/gpu``.
"""

from __future__ import annotations

import pytest
import torch

from tests.triton_interpreter import enter_interpreter, require_interpreted

enter_interpreter()

from kernels.triton.kv_indices import build_kv_indices  # noqa: E402
from kernels.triton.store_kv import _store_kv_kernel, store_kv  # noqa: E402
from tests.test_attention_backends import _run  # noqa: E402
from tests.tiny_models import greedy_tokens_by_backend  # noqa: E402

require_interpreted(_store_kv_kernel)

# (query heads, KV heads, head dim): GQA ratios 1, 3, 4 and 8, head dims 64 and 128
GEOMETRIES = [(4, 4, 64), (9, 3, 64), (8, 2, 128), (8, 1, 64)]


def _agree_with_torch_native(prefix_lens, extend_lens, heads, kv_heads, dim, decode=False, seed=0):
    """Both backends on the same inputs (``_run`` also checks each against the reference
    and that the new K/V landed in their slots)."""
    got = _run("triton", prefix_lens, extend_lens, heads, kv_heads, dim, decode=decode, seed=seed)
    want = _run("torch_native", prefix_lens, extend_lens, heads, kv_heads, dim, decode=decode, seed=seed)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "prefix_lens,extend_lens,geometry",
    [
        ([0], [1], GEOMETRIES[0]),  # a one-token prompt
        ([1], [1], GEOMETRIES[1]),  # a one-token prefix
        ([0, 1, 9], [7, 1, 3], GEOMETRIES[1]),
        ([20, 0, 1, 7], [1, 9, 2, 3], GEOMETRIES[3]),
        ([70, 0], [33, 66], GEOMETRIES[2]),  # blocks past the first, both passes
        ([130], [5], GEOMETRIES[0]),  # a prefix of several blocks, a short extend
    ],
)
def test_extend_matches_torch_native(prefix_lens, extend_lens, geometry):
    _agree_with_torch_native(prefix_lens, extend_lens, *geometry)


@pytest.mark.parametrize(
    "prefix_lens,geometry",
    [
        ([0], GEOMETRIES[0]),  # seq_len 1: seven of the eight splits are empty
        ([1, 15, 4, 40], GEOMETRIES[1]),
        ([3, 50, 7, 22, 1, 90, 14, 5], GEOMETRIES[3]),
        ([600, 2], GEOMETRIES[2]),  # several blocks per split
        ([63] * 3, GEOMETRIES[0]),
    ],
)
def test_decode_matches_torch_native(prefix_lens, geometry):
    _agree_with_torch_native(prefix_lens, [1] * len(prefix_lens), *geometry, decode=True)


def test_store_kv_from_a_strided_split():
    """K/V arrive as views into the fused QKV output: token stride wider than the row."""
    fused = torch.randn(5, 3 * 2 * 16)
    k = fused[:, 32:64].view(5, 2, 16)
    v = fused[:, 64:].view(5, 2, 16)
    k_cache, v_cache = torch.zeros(20, 2, 16), torch.zeros(20, 2, 16)
    loc = torch.tensor([7, 1, 19, 3, 12])
    store_kv(k, v, k_cache, v_cache, loc)
    torch.testing.assert_close(k_cache[loc], k)
    torch.testing.assert_close(v_cache[loc], v)
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[loc] = False
    assert not k_cache[untouched].any() and not v_cache[untouched].any()


def test_kv_indices_flatten_table_rows():
    table = torch.randint(1, 1000, (6, 1500), dtype=torch.int64)
    rows = torch.tensor([4, 0, 5])
    kv_lens = torch.tensor([1, 1200, 0], dtype=torch.int32)  # crosses the 512 block; an empty one
    indptr = torch.tensor([0, 1, 1201, 1201], dtype=torch.int32)
    indices = torch.full((1201,), -1, dtype=torch.int32)
    build_kv_indices(table, rows, kv_lens, indptr, indices)
    want = torch.cat([table[4, :1], table[0, :1200]]).to(torch.int32)
    assert torch.equal(indices, want)


def test_engine_greedy_tokens_match_torch_native(tiny_gqa_llama):
    """Prefill (whole prompts, a reused prefix, a second chunk) and batched decode through the
    real engine: the interpreted Triton backend picks the same tokens as torch_native."""
    outputs = greedy_tokens_by_backend(tiny_gqa_llama, ("torch_native", "triton"), (5, 40, 90), 6, seed=3)
    assert outputs["triton"] == outputs["torch_native"]
