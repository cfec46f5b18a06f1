"""The FlashInfer backend's own logic on CPU, against ``tests/fake_flashinfer.py`` (a
plain-PyTorch stand-in for the FlashInfer calls it makes): CSR indices built from the
table, one plan per step for all layers, the ragged + paged split merged by log-sum-exp,
tensor cores by GQA ratio, and the CUDA-graph hooks. FlashInfer's own kernels are tested
only on a GPU (``tests/gpu``). The Triton helpers it uses run in the interpreter.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("on a CUDA machine the real FlashInfer is tested, by tests/gpu", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton)")
if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9):
    pytest.skip(f"Triton's CPU interpreter needs triton>=3.9 here, found {triton.__version__}", allow_module_level=True)

from kernels.attention.base import AttentionShape  # noqa: E402
from kernels.attention.forward_context import ForwardContext, forward_context  # noqa: E402
from kernels.attention.triton_backend import TritonBackend  # noqa: E402
from runtime.executor.kv_pool import KVPool  # noqa: E402
from tests.fake_flashinfer import fake_flashinfer_module  # noqa: E402
from tests.test_attention_backends import _reference, _run  # noqa: E402


@pytest.fixture
def flashinfer_backend(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer_module())
    from kernels.attention.flashinfer_backend import FlashInferBackend

    return lambda heads, kv_heads, dim: FlashInferBackend(AttentionShape(heads, kv_heads, dim), "cpu")


@pytest.mark.parametrize(
    "prefix_lens,extend_lens",
    [([0], [1]), ([0, 0], [5, 9]), ([1], [1]), ([0, 3, 10], [4, 1, 6]), ([40, 0, 1], [7, 30, 2])],
)
@pytest.mark.parametrize("geometry", [(9, 3, 64), (8, 2, 128)])
def test_extend(flashinfer_backend, prefix_lens, extend_lens, geometry):
    backend = flashinfer_backend(*geometry)
    _run(backend, prefix_lens, extend_lens, *geometry)
    assert backend.ragged.plans == 1
    assert backend.paged.plans == (1 if any(prefix_lens) else 0)  # no prefix: no paged pass


@pytest.mark.parametrize("prefix_lens", [[0], [1, 15, 4, 40], [600, 2]])
@pytest.mark.parametrize("geometry", [(9, 3, 64), (8, 2, 128), (4, 4, 64)])
def test_decode(flashinfer_backend, prefix_lens, geometry):
    backend = flashinfer_backend(*geometry)
    _run(backend, prefix_lens, [1] * len(prefix_lens), *geometry, decode=True)
    assert backend.decode.use_tensor_cores == (geometry[0] // geometry[1] >= 4)


def test_one_plan_serves_every_layer(flashinfer_backend):
    backend = flashinfer_backend(4, 2, 64)
    pool = KVPool(64, 3, 2, 64, torch.float32, "cpu", layout="NHD")
    table = torch.arange(64).view(2, 32)
    ctx = ForwardContext(False, torch.tensor([1]), [5], [3], torch.tensor([37, 38, 39]), table, pool, backend)
    q, k = torch.randn(3, 4, 64), torch.randn(3, 2, 64)
    with forward_context(ctx):
        for layer in range(3):
            backend.forward(q, k, k, layer, 64**-0.5, ctx)
    assert backend.ragged.plans == 1 and backend.paged.plans == 1
    with forward_context(ctx), pytest.raises(ValueError, match="scale"):
        backend.forward(q, k, k, 0, 0.5, ctx)


def _decode_setup(seq_lens, heads, kv_heads, dim, seed=0):
    """A pool and table holding requests of ``seq_lens`` tokens (the last one new), with
    the table's last row all zeros: the dummy row padded graph entries read."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = sum(seq_lens) + 4
    pool = KVPool(num_slots, 1, kv_heads, dim, torch.float32, "cpu", layout="NHD")
    table = torch.zeros(len(seq_lens) + 1, max(seq_lens) + 2, dtype=torch.int32)
    perm = torch.randperm(num_slots - 1, generator=gen) + 1
    ks, vs, used = [], [], 0
    for i, n in enumerate(seq_lens):
        slots = perm[used : used + n]
        used += n
        table[i, :n] = slots
        ks.append(torch.randn(n, kv_heads, dim, generator=gen))
        vs.append(torch.randn(n, kv_heads, dim, generator=gen))
        pool.write(0, slots[:-1], ks[-1][:-1], vs[-1][:-1])
    q = torch.randn(len(seq_lens), heads, dim, generator=gen)
    new_slots = torch.stack([table[i, n - 1] for i, n in enumerate(seq_lens)]).long()
    return pool, table, q, ks, vs, new_slots


@pytest.mark.parametrize("which", ["flashinfer", "triton"])
def test_graph_hooks_pad_and_replay(flashinfer_backend, which):
    """Capture-then-replay metadata as the CUDA-graph runner drives it (without a graph):
    buffers pointed at for the captured size, refilled for a real batch of 3 padded to 4."""
    heads, kv_heads, dim = 9, 3, 64
    backend = flashinfer_backend(heads, kv_heads, dim) if which == "flashinfer" else TritonBackend(AttentionShape(heads, kv_heads, dim), "cpu")
    seq_lens = [7, 1, 130]
    pool, table, q, ks, vs, new_slots = _decode_setup(seq_lens, heads, kv_heads, dim)
    dummy_row = len(seq_lens)
    backend.init_cuda_graph_state(8, torch.device("cpu"))

    def context(rows, prefix_lens, loc):
        return ForwardContext(True, torch.tensor(rows), prefix_lens, [1] * len(rows), loc, table, pool, backend)

    capture = context([dummy_row] * 4, [0] * 4, torch.zeros(4, dtype=torch.int64))
    backend.init_forward_metadata_capture(capture)
    # the real batch, padded with one dummy request
    replay = context([0, 1, 2, dummy_row], [n - 1 for n in seq_lens] + [0], torch.cat([new_slots, torch.zeros(1, dtype=torch.int64)]))
    backend.init_forward_metadata_replay(replay)
    k_new = torch.cat([torch.stack([k[-1] for k in ks]), torch.zeros(1, kv_heads, dim)])
    v_new = torch.cat([torch.stack([v[-1] for v in vs]), torch.zeros(1, kv_heads, dim)])
    q_padded = torch.cat([q, torch.zeros(1, heads, dim)])
    with forward_context(replay, init_metadata=False):
        out = backend.forward(q_padded, k_new, v_new, 0, dim**-0.5, replay)
    want = _reference(q, ks, vs, [n - 1 for n in seq_lens], [1] * len(seq_lens), dim**-0.5)
    torch.testing.assert_close(out[:3], want, atol=1e-5, rtol=1e-4)
