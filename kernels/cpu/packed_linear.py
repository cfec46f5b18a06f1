"""Linear layers on CPU with the weight packed once, at load, for a fast GEMM kernel.

``F.linear`` on CPU hands a plain row-major weight to the GEMM library, which re-blocks it
for its micro-kernel on every call. A decode step is ~120 small GEMMs whose weights stream
from memory each time, so that per-call reorder is a large share of the step. Three packed
forms, chosen per dtype by ``pack_weight``:

- ``"bf16_panels"``: bfloat16 on CPUs with AVX512-BF16, for our own kernel
  (``linear_bf16.cpp``). On the default model's decode shapes (2 cores) it reads weights at
  ~27 GB/s at batch 1 where oneDNN reaches 14-20, and runs batch 32 ~20% faster.
- ``"f32_panels"``: float32 on CPUs with AVX2 and FMA but no AVX-512, for our own kernel
  (``linear_f32.cpp``). On an AMD Zen 3 (2 cores) it ran the default model's decode
  products 1.2-1.6x as fast as oneDNN's packed float32 (1-17 rows, weights from memory;
  ``python -m bench_agent.bench_gemm``) and prefill-sized ones about as fast.
  Where its weights are quantized blocks (a GGUF tensor's dequantized values), the same
  weight is also kept as those blocks (``few_rows``), from which products of a few rows
  (decode of a few requests) run up to ~2x as fast, to the same bits (``linear_blocks.cpp``):
  4-bit affine blocks (Q4_1, the default model's linear layers; ~0.19x the bytes) and 8-bit
  scaled blocks (Q8_0, its embedding and tied output layer; ~0.28x), each up to 8 rows.
- ``"onednn"``: everything else (float32 on AVX-512 CPUs; bfloat16 without AVX512-BF16),
  reordered into oneDNN's blocked layout, the ops ``torch.compile`` uses for frozen CPU models. Against
  ``F.linear`` this took ~30% less time at batch 1 and ~25% less at batch 32.

``python -m bench_agent.bench_offline`` shows the decode-step times. Results: float32 sums
of exact bfloat16 products rounded once (``"bf16_panels"``; ``F.linear`` may differ in the
last bit where its summation order rounds the other way); oneDNN's bfloat16 equals
``F.linear`` bit for bit; float32 (``"f32_panels"`` and oneDNN's) differs from it by the
summation order (~1e-6 relative).
``tests/test_cpu_packed_linear.py`` checks every form against a float64 product.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from kernels.cpu import linear_bf16, linear_blocks, linear_f32

# Our own packed forms and the module (``pack``, ``linear``) of each.
_OURS = {"bf16_panels": linear_bf16, "f32_panels": linear_f32}


class PackedLinearUnavailable(RuntimeError):
    """No packed form fits here: a PyTorch build without oneDNN (mkldnn), or a CPU neither
    our kernels nor oneDNN can pack this dtype for."""


@dataclass(frozen=True)
class PackedWeight:
    """A linear weight ``[out_features, in_features]`` packed for one kernel (``kind``)."""

    data: torch.Tensor
    out_features: int
    in_features: int
    dtype: torch.dtype
    kind: str  # "bf16_panels", "f32_panels" or "onednn"
    # For "f32_panels" whose values are quantized blocks: the same weight packed for the
    # block kernel in the form named ``blocks`` (a key of linear_blocks.FORMS), which takes
    # products of up to its few_rows() rows; else None.
    few_rows: torch.Tensor | None = None
    blocks: str | None = None


@functools.cache
def _onednn_ops():  # noqa: ANN202
    if not torch.backends.mkldnn.is_available():
        raise PackedLinearUnavailable("this PyTorch build has no oneDNN (mkldnn) support")
    try:
        return torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError) as err:
        raise PackedLinearUnavailable(f"this PyTorch build lacks oneDNN's packed linear ops: {err}") from err


@functools.cache
def _onednn_can_pack(dtype: torch.dtype) -> None:
    """oneDNN refuses bfloat16 on CPUs without AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT, so a
    small weight is packed and applied once to find out."""
    reorder, linear = _onednn_ops()
    try:
        linear(torch.ones(1, 16, dtype=dtype), reorder(torch.ones(16, 16, dtype=dtype)), None, "none", [], "")
    except RuntimeError as err:
        raise PackedLinearUnavailable(f"oneDNN cannot pack {dtype} weights on this CPU: {err}") from err


def kind_for(dtype: torch.dtype) -> str:
    """The packed form ``pack_weight`` uses for ``dtype`` here; raises
    ``PackedLinearUnavailable`` (with the reason) when there is none."""
    if dtype == torch.bfloat16 and linear_bf16.available():
        return "bf16_panels"
    if dtype == torch.float32 and linear_f32.preferred():
        return "f32_panels"
    _onednn_can_pack(dtype)
    return "onednn"


def check_packing_available(dtype: torch.dtype) -> None:
    """Raise ``PackedLinearUnavailable`` unless weights of ``dtype`` can be packed here."""
    kind_for(dtype)


def pack_weight(weight: torch.Tensor) -> PackedWeight:
    """``weight`` (``[out, in]``, float32 or bfloat16, CPU) packed for ``packed_linear``.
    Keep the result for the life of the layer; the plain weight is no longer needed."""
    if weight.device.type != "cpu" or weight.dim() != 2 or weight.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"pack_weight takes a 2-D float32/bfloat16 CPU tensor, got {weight.dtype} "
                         f"{tuple(weight.shape)} on {weight.device}")
    kind = kind_for(weight.dtype)
    weight = weight.detach().contiguous()
    data = _OURS[kind].pack(weight) if kind in _OURS else _onednn_ops()[0](weight)
    form, blocks = _block_form(weight) if kind == "f32_panels" else (None, None)
    return PackedWeight(data, weight.shape[0], weight.shape[1], weight.dtype, kind, blocks, form)


def _block_form(weight: torch.Tensor) -> tuple[str | None, torch.Tensor | None]:
    """The name of the first of linear_blocks.FORMS that holds ``weight``'s float32 values
    exactly, and the weight packed in it; (None, None) when none does (or this build has no
    block kernel)."""
    if linear_blocks.available():
        for name, form in linear_blocks.FORMS.items():
            if (blocks := form.pack(weight)) is not None:
                return name, blocks
    return None, None


def packed_linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` packed by ``pack_weight``."""
    if x.dtype != packed.dtype or x.shape[-1] != packed.in_features:
        raise ValueError(f"packed_linear: input {x.dtype} {tuple(x.shape)} does not fit the weight "
                         f"{packed.dtype} {(packed.out_features, packed.in_features)}")
    if packed.few_rows is not None:
        form = linear_blocks.FORMS[packed.blocks]
        if x.numel() <= form.few_rows() * packed.in_features:
            return form.linear(x, packed.few_rows, packed.out_features, bias)
    if packed.kind in _OURS:
        return _OURS[packed.kind].linear(x, packed.data, packed.out_features, bias)
    return _onednn_ops()[1](x, packed.data, bias, "none", [], "")
