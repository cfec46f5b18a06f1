"""torch_native's decode buffers (``kernels/attention/decode_kv_buffers.py``): over many
steps in a row (requests leaving, joining after a prefill, outgrowing their buffers), every
layer's output still equals the brute-force reference over the true K/V."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.attention import decode_kv_buffers
from kernels.attention.torch_native import TorchNativeBackend
from runtime.forward_context import ForwardContext, forward_context
from runtime.kv_pool import KVPool
from tests.test_attention_backends import _reference

HEADS, KV_HEADS, DIM, LAYERS = 9, 3, 64, 2


class Sim:
    """A pool, a request-to-token table and the true K/V of every request, per layer."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.pool = KVPool(4000, LAYERS, KV_HEADS, DIM, torch.float32, "cpu", layout="HND")
        self.table = torch.zeros(16, 400, dtype=torch.int64)
        self.free = (torch.randperm(3999, generator=self.gen) + 1).tolist()
        self.kv: dict[int, list[list[torch.Tensor]]] = {}  # row -> layer -> [k, v] of shape [seq, KV, D]
        self.backend = TorchNativeBackend()

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)

    def step(self, rows: list[int], extend: list[int]) -> None:
        """One forward over ``rows``, each adding ``extend[i]`` tokens; checks every layer."""
        prefix = [len(self.kv[r][0][0]) if r in self.kv else 0 for r in rows]
        locs = []
        for r, p, e in zip(rows, prefix, extend, strict=True):
            slots = torch.tensor([self.free.pop() for _ in range(e)])
            self.table[r, p : p + e] = slots
            locs.append(slots)
        is_decode = all(e == 1 for e in extend) and all(p > 0 for p in prefix)
        ctx = ForwardContext(is_decode, torch.tensor(rows), prefix, extend, torch.cat(locs), self.table, self.pool, self.backend)
        scale = 1 / math.sqrt(DIM)
        with forward_context(ctx):
            for layer in range(LAYERS):
                q = self.rand(sum(extend), HEADS, DIM)
                k_new, v_new = self.rand(sum(extend), KV_HEADS, DIM), self.rand(sum(extend), KV_HEADS, DIM)
                got = self.backend.forward(q, k_new, v_new, layer, scale, ctx)
                ks, vs, t = [], [], 0
                for r, e in zip(rows, extend, strict=True):
                    old = self.kv.setdefault(r, [[torch.empty(0, KV_HEADS, DIM)] * 2 for _ in range(LAYERS)])
                    old[layer] = [torch.cat([old[layer][0], k_new[t : t + e]]), torch.cat([old[layer][1], v_new[t : t + e]])]
                    ks.append(old[layer][0])
                    vs.append(old[layer][1])
                    t += e
                want = _reference(q, ks, vs, prefix, extend, scale)
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("headroom", [64, 2])
def test_decode_steps_match_the_reference(monkeypatch, headroom):
    monkeypatch.setattr(decode_kv_buffers, "HEADROOM", headroom)
    monkeypatch.setattr("kernels.attention.torch_native.HEADROOM", headroom)
    sim = Sim(seed=headroom)
    sim.step([3, 5, 1, 7], [5, 40, 1, 17])  # prefill
    for _ in range(6):
        sim.step([3, 5, 1, 7], [1, 1, 1, 1])
    if headroom == 64:
        assert sim.backend.decode_buffers is not None and sim.backend.decode_buffers.step == 5, "buffers reused"
    for _ in range(3):  # request 5 finished
        sim.step([3, 1, 7], [1, 1, 1])
    sim.step([9], [12])  # a new request's prefill
    for _ in range(4):
        sim.step([3, 1, 7, 9], [1, 1, 1, 1])
    sim.step([7, 3], [1, 1])  # order changed: a fresh gather, still right
    sim.step([7, 3], [1, 1])


def test_buffers_over_budget_are_not_kept(monkeypatch):
    monkeypatch.setattr("kernels.attention.torch_native.BUDGET_BYTES", 1)
    sim = Sim(seed=1)
    sim.step([2, 4], [30, 3])
    for _ in range(3):
        sim.step([2, 4], [1, 1])
    assert sim.backend.decode_buffers is None
