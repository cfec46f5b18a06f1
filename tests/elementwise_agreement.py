"""The fused elementwise kernels (``kernels/cpu/elementwise.py``, ``kernels/triton/elementwise.py``:
same functions, same rounding) against the PyTorch layers they replace, which are themselves
checked against transformers elsewhere. Each check takes the kernels' module and the device
to run them on; the layers compute the oracle on the CPU."""

from __future__ import annotations

from types import ModuleType

import torch

from runtime.layers.norm import RMSNorm
from runtime.layers.rotary import RotaryEmbedding

# Triton's CPU interpreter rounds float32 to bfloat16 toward zero, not to nearest as GPUs
# and PyTorch do: there bfloat16 results are only within a step, rarely bit-equal.
TRUNCATING = 0.0


def agree(got: torch.Tensor, want: torch.Tensor, min_equal: float = 0.98) -> None:
    """float32: to rounding; bfloat16: at least ``min_equal`` of the elements bit-equal, the
    rest one step apart (where float32 intermediates differ in their last bits, a rounding
    can flip)."""
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        return
    equal = (got == want).float().mean().item()
    assert equal >= min_equal, f"only {equal:.3f} of the elements are bit-equal"
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1.6e-2)


def check_rms_norm(
    ops: ModuleType, rows: int, hidden: int, dtype: torch.dtype, device: str = "cpu", min_equal: float = 0.98
) -> None:
    gen = torch.Generator().manual_seed(rows)
    norm = RMSNorm(hidden, 1e-5)
    norm.weight.data = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    x = (3 * torch.randn(rows, hidden, generator=gen)).to(dtype)
    weight = norm.weight.data.to(device)
    agree(ops.rms_norm(x.to(device), weight, norm.eps), norm(x), min_equal)
    # with a skip connection: the sum in place (rounded as the layer's add) and its norm
    residual = torch.randn(x.shape, generator=gen).to(dtype)
    want, want_residual = norm(x, residual)
    ours_residual = residual.to(device)
    agree(ops.rms_norm(x.to(device), weight, norm.eps, ours_residual), want, min_equal)
    if min_equal == TRUNCATING:
        agree(ours_residual, want_residual, min_equal)
    else:  # one add of two dtype values, rounded once: exact
        assert torch.equal(ours_residual.cpu(), want_residual)


def check_rotary_on_views_of_a_fused_projection(
    ops: ModuleType, tokens: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype, device: str = "cpu",
    min_equal: float = 0.98,
) -> None:
    gen = torch.Generator().manual_seed(tokens)
    rope = RotaryEmbedding(dim, 4096, 10000.0)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    positions = torch.randint(0, 4096, (tokens,), generator=gen)

    def views(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, _ = t.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
        return q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)

    want_q, want_k = rope(positions, *views(qkv))
    fused = qkv.clone().to(device)  # a copy on the CPU too: v is compared with the original
    q, k = views(fused)
    ops.rotary_(q, k, positions.to(device), rope.cos.to(device), rope.sin.to(device))
    agree(q, want_q, min_equal)
    agree(k, want_k, min_equal)
    v_start = (heads + kv_heads) * dim
    assert torch.equal(fused[:, v_start:].cpu(), qkv[:, v_start:])  # v untouched


def check_silu_and_mul(
    ops: ModuleType, rows: int, dtype: torch.dtype, device: str = "cpu", width: int = 1536, min_equal: float = 0.98
) -> None:
    gen = torch.Generator().manual_seed(rows)
    gate_up = (4 * torch.randn(rows, 2 * width, generator=gen)).to(dtype)
    gate, up = gate_up.split(width, dim=-1)
    agree(ops.silu_and_mul(gate_up.to(device)), torch.nn.functional.silu(gate) * up, min_equal)
