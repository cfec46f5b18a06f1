"""Which decode tokens attend their shared first keys together (``shared_prefix_groups``,
``paged_attention``'s grouping thresholds, ``kernels/cpu/paged_attention.cpp``): forks grouped
per program by their longest common prefix, and the shared-keys threshold of each K/V storage
type. The grouped kernel's results against the reference are in ``test_cpu_attention.py``,
whose batches these tests build."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import build, entry_checks
from kernels.cpu.paged_attention import (
    AMX_SHARED_MIN_ROWS,
    DEFAULT_SHARED_MIN_KEYS,
    grouping_min_keys,
    last_grouped_tokens,
    shared_min_keys,
    shared_min_rows,
    shared_prefix_groups,
)
from runtime.config import cpu_flags
from tests.test_attention_backends import TOLERANCE
from tests.test_cpu_attention import (
    GEOMETRIES,
    SHARED_MIN_KEYS,
    SHARED_MIN_ROWS,
    _forked_decodes,
    _row_kernel,
)

FLOAT32_SHARED_MIN_KEYS = 256  # the float32 K/V default (kSharedMinKeysF32)


def test_forks_are_grouped_by_their_longest_common_prefix(monkeypatch):
    """Two programs' forks on one system prompt: grouped per program over system prompt and
    question, not all together over the system prompt; too few forks, or too short a shared
    prefix at the default setting, stay per token."""
    geometry = GEOMETRIES[1]  # 3 query heads per KV head: 8 to 16 tokens a group
    if _row_kernel("native", geometry[2]) is None:
        pytest.skip("no row-block kernel in this CPU's build: decode tokens are never grouped")
    # This CPU's build, whichever build another test's fixture has put in place.
    monkeypatch.setattr(entry_checks, "load_kernels", build.load_kernels)
    gen = torch.Generator().manual_seed(0)
    batch, _, _ = _forked_decodes([(8, 60), (8, 60), (5, 60)], geometry, gen)
    system = batch.req_to_token[1, :20].clone()
    for r in range(1, 17):
        batch.req_to_token[r, :20] = system
    with shared_min_rows(SHARED_MIN_ROWS):
        with shared_min_keys(16):
            found = shared_prefix_groups(batch, *geometry)
        assert sorted((tokens, keys) for tokens, keys in found) == [(list(range(8)), 60), (list(range(8, 16)), 60)]
        with shared_min_keys(DEFAULT_SHARED_MIN_KEYS):
            assert shared_prefix_groups(batch, *geometry) == []  # 60 shared keys: short of the default
    with shared_min_rows(AMX_SHARED_MIN_ROWS), shared_min_keys(16):  # 4 forks are enough
        found = shared_prefix_groups(batch, *geometry)
    assert sorted(len(tokens) for tokens, _ in found) == [5, 8, 8]


def test_forks_on_float32_kv_are_grouped_from_fewer_shared_keys(monkeypatch):
    """By default decode forks attend 300 shared keys together where the K/V cache is float32
    (from 256 keys), one by one where it is bfloat16 (from 1,024): the storage type's default,
    whatever engines of the other dtype this process made before."""
    geometry = GEOMETRIES[1]  # 3 query heads per KV head: 8 forks fill the AVX2 kernel's 24 rows
    if not {"avx2", "fma"} <= cpu_flags():
        pytest.skip("no row-block kernel for float32 in this CPU's build: decode tokens are never grouped")
    monkeypatch.setattr(entry_checks, "load_kernels", build.load_kernels)
    with shared_min_rows(SHARED_MIN_ROWS), shared_min_keys(DEFAULT_SHARED_MIN_KEYS):
        assert (grouping_min_keys(torch.float32), grouping_min_keys(torch.bfloat16)) == (
            FLOAT32_SHARED_MIN_KEYS, SHARED_MIN_KEYS)
        for dtype, grouped in ((torch.float32, 8), (torch.bfloat16, 0)):
            _, got, want = _forked_decodes([(8, 300)], geometry, torch.Generator().manual_seed(7), dtype=dtype)
            assert last_grouped_tokens() == grouped, dtype
            torch.testing.assert_close(got, want, **TOLERANCE[dtype])
        with shared_min_keys(512):  # a setting holds for both types
            assert grouping_min_keys(torch.float32) == grouping_min_keys(torch.bfloat16) == 512
