"""Python entry points of the float32 GEMM on quantized weight blocks (``linear_blocks.cpp``).

A float32 weight may be, along each output row, blocks of 32 values that a scale ``d``
(exactly a float16 value) and small integers ``q`` give back exactly, as a GGUF tensor
dequantizes to. Two such forms, each a ``BlockForm``:

- ``Q4_1``: 4-bit affine blocks ``d * q + m``, ``q`` in 0..15 (GGUF Q4_1: the default
  model's linear layers);
- ``Q8_0``: 8-bit scaled blocks ``d * q``, ``q`` in -128..127 (GGUF Q8_0: its embedding,
  and so its tied output layer).

A form's ``blocks_of`` finds whether a weight is such blocks, checked bit for bit (in
PyTorch: the reference); ``pack`` finds and lays them out for the kernel in one compiled
pass (``linear_blocks_pack``; ``None`` for any other weight), ``pack_reference`` does the
same from ``blocks_of``; ``linear`` multiplies. The product is the same bits as
``linear_f32``'s on the float32 weight (the same float32 values, summed in the same order),
so a layer may take either kernel for any product; ``few_rows`` says up to how many rows
this one is the faster (``packed_linear.py`` keeps both forms of such weights).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kernels.cpu.build import load_kernels
from kernels.cpu.gemm_entry import built_with, run_packed_gemm

BLOCK = 32  # input features per block
COLUMNS = 16  # output columns per panel

# A weight's blocks: the per-block scales (float32 [out, in / 32] each) and the integers
# ([out, in / 32, 32]).
Blocks = tuple[list[torch.Tensor], torch.Tensor]


def available() -> bool:
    """Whether the compiled library here has the kernel (a CPU with AVX2 and FMA)."""
    return built_with("linear_blocks_available")


class BlockForm:
    """One block format of ``linear_blocks.cpp`` (``index``: its number there, entries.h)."""

    def __init__(self, name: str, index: int, find: Callable[[torch.Tensor], Blocks | None],
                 q_bytes: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.name, self.index = name, index
        self._find = find  # the blocks of a finite float32 [out, in] weight (in a multiple of 32), or None
        self._q_bytes = q_bytes  # the integers by panel ([panels, blocks, 32, 16]) as the kernel's bytes

    def __repr__(self) -> str:
        return f"BlockForm({self.name})"

    @functools.cache  # noqa: B019  (two module-level forms, never freed)
    def few_rows(self) -> int:
        """Products of up to this many rows run faster here than on ``linear_f32``'s panels
        (measured: ``linear_blocks.cpp``), so packed layers take this kernel for them."""
        return int(load_kernels().linear_blocks_few_rows(self.index))

    def blocks_of(self, weight: torch.Tensor) -> Blocks | None:
        """The scales and integers of a float32 ``[out, in]`` weight in this form, checked to
        give back every value bit for bit; else None."""
        out_features, in_features = weight.shape
        if weight.dtype != torch.float32 or in_features % BLOCK or weight.numel() == 0:
            return None
        # Other weights fail on their first row already: checking it first skips the whole
        # tensor (~0.6 s for the default model's embedding against the 4-bit form).
        if out_features > 1 and self._checked(weight[:1]) is None:
            return None
        return self._checked(weight)

    def _checked(self, weight: torch.Tensor) -> Blocks | None:
        return self._find(weight) if torch.isfinite(weight).all() else None

    def pack(self, weight: torch.Tensor) -> torch.Tensor | None:
        """``weight`` (float32 ``[out, in]``) in the kernel's layout (``linear_blocks.cpp``) as a
        flat float32 tensor of its bytes, or None when it is not blocks of this form. One
        compiled pass (the default model's weights, both forms tried: ~0.3 s against ~1.9 s
        for ``pack_reference``), or ``pack_reference`` where the library cannot pack."""
        weight = weight.detach()
        if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu":
            raise ValueError(f"{self.name} pack takes a 2-D float32 CPU tensor, got {weight.dtype} "
                             f"{tuple(weight.shape)} on {weight.device}")
        out_features, in_features = weight.shape
        if in_features % BLOCK or weight.numel() == 0:
            return None
        weight = weight.contiguous()
        packed = torch.empty(self._packed_bytes(out_features, in_features) // 4, dtype=torch.float32)
        found = load_kernels().linear_blocks_pack(self.index, weight.data_ptr(), out_features, in_features,
                                                  packed.data_ptr(), torch.get_num_threads())
        if found == 3:  # a build without F16C
            return self.pack_reference(weight)
        assert found in (0, 1), found
        return packed if found else None

    def pack_reference(self, weight: torch.Tensor) -> torch.Tensor | None:
        """``pack`` from ``blocks_of``, in PyTorch."""
        found = self.blocks_of(weight.detach())
        if found is None:
            return None
        scales, q = found
        out_features, blocks = q.shape[:2]
        count = -(-out_features // COLUMNS)
        pad = count * COLUMNS - out_features  # columns past out_features: zeros
        # [panel, block, column] scales, then [panel, block, k, column] integers
        parts = [F.pad(s, (0, 0, 0, pad)).view(count, COLUMNS, blocks).transpose(1, 2) for s in scales]
        q = F.pad(q, (0, 0, 0, 0, 0, pad)).view(count, COLUMNS, blocks, BLOCK).permute(0, 2, 3, 1)
        parts.append(self._q_bytes(q))
        packed = torch.cat([p.contiguous().view(torch.uint8).reshape(count, blocks, -1) for p in parts], dim=-1)
        assert packed.numel() == self._packed_bytes(*weight.shape)
        return packed.reshape(-1).view(torch.float32)

    def _packed_bytes(self, out_features: int, in_features: int) -> int:
        return load_kernels().linear_blocks_packed_bytes(self.index, out_features, in_features)

    def linear(self, x: torch.Tensor, packed: torch.Tensor, out_features: int,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T + bias`` for float32 ``x`` (``[..., in]``) and ``W`` packed by ``pack``."""
        name = f"linear_blocks {self.name}"
        if x.shape[-1] % BLOCK:
            raise ValueError(f"{name}: input width {x.shape[-1]} is not a multiple of {BLOCK}")
        entry = functools.partial(load_kernels().linear_blocks, self.index)
        return run_packed_gemm(name, torch.float32, entry,
                               "this build of the CPU kernels has no float32 GEMM on weight blocks (no AVX2 and FMA)",
                               x, packed, self._packed_bytes(out_features, x.shape[-1]) // 4, out_features, bias)


def _rebuilds(weight: torch.Tensor, again: torch.Tensor) -> bool:
    """Whether ``again`` is ``weight`` bit for bit (a -0.0 is not a +0.0)."""
    return torch.equal(again.reshape(weight.shape).view(torch.int32), weight.view(torch.int32))


def _q4_1_blocks(weight: torch.Tensor) -> Blocks | None:
    """Each block's offset ``m`` its smallest value, its scale ``d`` a fifteenth of its range
    rounded to float16 (how Q4_1 quantizes); ``d * q + m`` in float32 (``d * q`` exact: one
    rounding, as the kernel's FMA)."""
    out_features, in_features = weight.shape
    blocks = weight.reshape(out_features, in_features // BLOCK, BLOCK)
    m = blocks.amin(-1)
    d = ((blocks.amax(-1) - m) / 15).to(torch.float16).to(torch.float32)
    if not torch.isfinite(d).all():
        return None
    step = torch.where(d > 0, d, torch.ones_like(d)).unsqueeze(-1)
    q = ((blocks - m.unsqueeze(-1)) / step).round().clamp(0, 15).to(torch.uint8)
    return ([d, m], q) if _rebuilds(weight, d.unsqueeze(-1) * q.float() + m.unsqueeze(-1)) else None


def _q8_0_blocks(weight: torch.Tensor) -> Blocks | None:
    """Each block's scale ``d`` its largest magnitude over 127 rounded to float16 (how Q8_0
    quantizes: its largest value is then exactly 127 steps); ``d * q`` exact. The check goes
    from the integers, as the kernel widens them: a -0.0 weight does not come back."""
    out_features, in_features = weight.shape
    blocks = weight.reshape(out_features, in_features // BLOCK, BLOCK)
    d = (blocks.abs().amax(-1) / 127).to(torch.float16).to(torch.float32)
    if not torch.isfinite(d).all():
        return None
    step = torch.where(d > 0, d, torch.ones_like(d)).unsqueeze(-1)
    q = (blocks / step).round().clamp(-128, 127).to(torch.int8)
    return ([d], q) if _rebuilds(weight, d.unsqueeze(-1) * q.float()) else None


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """Byte j of a k: column j in the low nibble, column j + 8 in the high one."""
    return q[..., : COLUMNS // 2] | (q[..., COLUMNS // 2 :] << 4)


Q4_1 = BlockForm("q4_1", 0, _q4_1_blocks, _nibbles)
Q8_0 = BlockForm("q8_0", 1, _q8_0_blocks, lambda q: q)
# Every form, by name, in the order packed_linear tries them.
FORMS = {form.name: form for form in (Q4_1, Q8_0)}
