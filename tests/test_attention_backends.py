"""Attention backends against a brute-force reference: per request, per query, softmax over
exactly the keys it may see, with K/V read back through the request-to-token table."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.attention import create_attention_backend
from kernels.attention.base import AttentionShape
from kernels.attention.forward_context import ForwardContext, forward_context
from runtime.executor.kv_pool import KVPool


def _reference(q, k_all, v_all, prefix_lens, extend_lens, scale):
    """q: [tokens, H, D]; k_all/v_all: per request [seq, KV, D] (prefix then new tokens)."""
    out, t = [], 0
    for k, v, p, e in zip(k_all, v_all, prefix_lens, extend_lens, strict=True):
        group = q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        for j in range(e):
            visible = p + j + 1
            scores = torch.einsum("hd,shd->hs", q[t + j], kk[:visible]) * scale
            out.append(torch.einsum("hs,shd->hd", scores.softmax(-1), vv[:visible]))
        t += e
    return torch.stack(out)


# Tolerances against the float32 reference, by the dtype the backend computes in.
TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _run(backend_name, prefix_lens, extend_lens, heads, kv_heads, dim, decode=False, seed=0, device="cpu", dtype=torch.float32, tolerance=None):
    """Run one attention call of ``backend_name`` on random inputs (scattered slots, cached
    prefixes already in the pool) and check it against the brute-force reference computed
    in float32 from the same (rounded) inputs. Returns the backend's output."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = sum(p + e for p, e in zip(prefix_lens, extend_lens, strict=True)) + 8
    backend = (
        create_attention_backend(backend_name, device, AttentionShape(heads, kv_heads, dim))
        if isinstance(backend_name, str)
        else backend_name  # an already built backend
    )
    pool = KVPool(num_slots, 1, kv_heads, dim, dtype, device, layout=backend.kv_layout)
    bs = len(prefix_lens)
    table = torch.zeros(bs + 2, max(p + e for p, e in zip(prefix_lens, extend_lens, strict=True)) + 4, dtype=torch.int64)
    perm = torch.randperm(num_slots - 1, generator=gen) + 1  # scattered slots, never slot 0
    rows = torch.tensor(list(range(bs + 2))[2:] + [0, 1])[:bs]
    k_all, v_all, locs, used = [], [], [], 0
    for i, (p, e) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        slots = perm[used : used + p + e]
        used += p + e
        table[rows[i], : p + e] = slots
        k = torch.randn(p + e, kv_heads, dim, generator=gen).to(dtype)
        v = torch.randn(p + e, kv_heads, dim, generator=gen).to(dtype)
        pool.write(0, slots[:p].to(device), k[:p].to(device), v[:p].to(device))  # the cached prefix
        k_all.append(k)
        v_all.append(v)
        locs.append(slots[p:])
    q = torch.randn(sum(extend_lens), heads, dim, generator=gen).to(dtype)
    k_new = torch.cat([k[p:] for k, p in zip(k_all, prefix_lens, strict=True)])
    v_new = torch.cat([v[p:] for v, p in zip(v_all, prefix_lens, strict=True)])
    ctx = ForwardContext(
        decode, rows, list(prefix_lens), list(extend_lens), torch.cat(locs).to(device), table.to(device), pool, backend
    )
    scale = 1 / math.sqrt(dim)
    with forward_context(ctx):
        got = backend.forward(q.to(device), k_new.to(device), v_new.to(device), 0, scale, ctx).cpu()
    want = _reference(
        q.float(), [k.float() for k in k_all], [v.float() for v in v_all], prefix_lens, extend_lens, scale
    )
    torch.testing.assert_close(got.float(), want, **(tolerance or TOLERANCE[dtype]))
    # the new tokens' K/V were stored where the scheduler said
    torch.testing.assert_close(pool.read(0, ctx.out_cache_loc)[0].cpu(), k_new)
    return got


@pytest.mark.parametrize(
    "prefix_lens,extend_lens",
    [([0], [1]), ([0], [7]), ([5], [1]), ([0, 3, 10], [4, 1, 6]), ([20, 0, 1, 7], [1, 9, 2, 3]), ([33], [17]), ([0, 12], [45, 40]), ([70, 0, 5], [33, 64, 2])],
)
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 64), (9, 3, 64), (8, 2, 128)])
def test_torch_native_extend(prefix_lens, extend_lens, heads, kv_heads, dim):
    _run("torch_native", prefix_lens, extend_lens, heads, kv_heads, dim)


@pytest.mark.parametrize(
    "prefix_lens", [[0], [6], [1, 15, 4, 40], [63] * 8, [3, 50, 7, 22, 1, 90, 14, 5, 33, 61, 2, 9, 40]]
)
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 8, 128)])
def test_torch_native_decode(prefix_lens, heads, kv_heads, dim):
    _run("torch_native", prefix_lens, [1] * len(prefix_lens), heads, kv_heads, dim, decode=True)


def test_unknown_or_unavailable_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="available"):
        create_attention_backend("nope", "cpu")
