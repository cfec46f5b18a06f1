"""The compiled KV store (``kernels/cpu/paged_attention.py`` ``store_kv``), which the ``cpu``
attention backend calls before each step's attention: against ``KVPool.write``, and what it
refuses before writing anything."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import build

if build.find_compiler() is None:
    pytest.skip("no C++ compiler on PATH: the cpu kernels cannot be built", allow_module_level=True)

from kernels.cpu.paged_attention import store_kv  # noqa: E402
from runtime.executor.kv_pool import KVPool  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 5, 700])
def test_store_kv_writes_what_kv_pool_write_writes(tokens, dtype):
    """K/V as views into a fused QKV row (strided tokens), scattered slots: the pool ends up
    as ``KVPool.write`` leaves it, and no other slot changes."""
    gen = torch.Generator().manual_seed(tokens)
    kv_heads, dim, num_slots = 3, 64, 1600
    qkv = torch.randn(tokens, (9 + 2 * kv_heads) * dim, generator=gen).to(dtype)
    _, k, v = qkv.split([9 * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    k, v = k.view(tokens, kv_heads, dim), v.view(tokens, kv_heads, dim)
    loc = torch.randperm(num_slots - 1, generator=gen)[:tokens] + 1
    ours = KVPool(num_slots, 1, kv_heads, dim, dtype, "cpu", layout="HND")
    ref = KVPool(num_slots, 1, kv_heads, dim, dtype, "cpu", layout="HND")
    for pool in (ours, ref):  # the same old contents
        pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=torch.Generator().manual_seed(0)))
        pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=torch.Generator().manual_seed(1)))
    store_kv(ours.k[0], ours.v[0], loc, k, v)
    ref.write(0, loc, k, v)
    assert torch.equal(ours.k[0], ref.k[0]) and torch.equal(ours.v[0], ref.v[0])


def test_store_kv_rejects_what_it_cannot_write():
    k_cache = torch.zeros(2, 10, 8)
    v_cache = torch.zeros(2, 10, 8)
    kv = torch.ones(3, 2, 8)
    for bad_loc in ([1, 2, 10], [-1, 2, 3]):
        with pytest.raises(ValueError, match="outside the pool"):
            store_kv(k_cache, v_cache, torch.tensor(bad_loc), kv, kv)
    assert not k_cache.any()  # checked before anything was written
    with pytest.raises(ValueError, match="int64"):
        store_kv(k_cache, v_cache, torch.tensor([1, 2, 3], dtype=torch.int32), kv, kv)
    with pytest.raises(ValueError, match="do not fit"):
        store_kv(k_cache, v_cache, torch.tensor([1, 2, 3]), torch.ones(3, 1, 8), torch.ones(3, 1, 8))
    with pytest.raises(ValueError, match="dtype"):
        store_kv(k_cache, v_cache, torch.tensor([1, 2, 3]), kv.bfloat16(), kv.bfloat16())
    with pytest.raises(ValueError, match="packed"):
        store_kv(k_cache, v_cache, torch.tensor([1, 2]), kv.transpose(0, 1), kv.transpose(0, 1))
