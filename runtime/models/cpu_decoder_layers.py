"""Every decoder layer of a Llama-family model in one compiled call (``kernels/cpu/decoder_layers.cpp``).

On the cpu backend, a step's layers are the same ten kernels per layer whatever the batch;
only the Python between them differs. At batch 1 that Python (module calls,
views, each wrapper's checks, ~300 ctypes calls) took about a third of the model's time on
2 cores. Here the per-layer pointers (packed weights, norms, K/V pool tensors) are checked
and tabled once; each step checks its own tensors and makes one call. The C++ runs exactly
the kernels the modules call, in their order, so outputs are bit-identical to the module
path (``tests/test_cpu_decoder_layers.py`` compares the two). Two storage types: bfloat16
with weights packed for our bf16 GEMM (AVX512-BF16), float32 with weights packed for our
float32 GEMM (AVX2 CPUs without AVX-512).

Building ``CpuDecoderLayers(model, kv_pool)`` raises ``ValueError`` saying why a model cannot
use it (another dtype, weights not packed for our GEMM of that dtype, tensor parallelism,
another KV layout, a shape the table does not take); the worker then logs it and keeps the
module path.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch

from kernels.attention.forward_context import get_forward_context
from kernels.cpu import linear_blocks
from kernels.cpu.build import CpuKernelsUnavailable, load_kernels
from kernels.cpu.entry_checks import SUFFIX
from kernels.cpu.paged_attention import PagedBatch

if TYPE_CHECKING:
    from runtime.executor.kv_pool import KVPool
    from runtime.models.llama import LlamaForCausalLM

_I64, _P, _F = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


class _Shape(ctypes.Structure):  # DecoderShape
    _fields_ = [("hidden", _I64), ("intermediate", _I64), ("num_heads", _I64), ("kv_heads", _I64),
                ("head_dim", _I64), ("num_slots", _I64), ("max_positions", _I64), ("eps", _F), ("scale", _F),
                ("cos", _P), ("sin", _P)]


class _Layer(ctypes.Structure):  # DecoderLayer
    _fields_ = [("input_norm", _P), ("post_norm", _P), ("qkv_bias", _P), ("qkv", _P), ("o", _P), ("gate_up", _P),
                ("down", _P), ("k_cache", _P), ("v_cache", _P), ("qkv_blocks", _P), ("o_blocks", _P),
                ("gate_up_blocks", _P), ("down_blocks", _P), ("qkv_format", _I64), ("o_format", _I64),
                ("gate_up_format", _I64), ("down_format", _I64)]


class _Step(ctypes.Structure):  # DecoderStep
    _fields_ = [("tokens", _I64), ("positions", _P), ("out_cache_loc", _P), ("req_to_token", _P),
                ("r2t_stride", _I64), ("rows", _P), ("prefix", _P), ("q_start", _P), ("token_req", _P),
                ("max_keys", _I64)]


def layer_table_mismatch(lib: object) -> str | None:
    """Why the decoder layers of the kernel library ``lib`` (this build's, or another
    revision's in ``bench_agent/bench_kernel_ab.py``) cannot read the table ``_Layer`` lays
    out; None when they can. A library reading it with another entry size would crash or
    read garbage."""
    size = getattr(lib, "decoder_layer_bytes", None)
    if size is None:
        return "its kernels cannot say their layer table's layout (no decoder_layer_bytes)"
    size.restype = ctypes.c_int64
    if size() != ctypes.sizeof(_Layer):
        return f"its layer table has {size()}-byte entries, this checkout's _Layer {ctypes.sizeof(_Layer)}"
    return None


_STATUS = {
    1: "a position is outside the rotary tables",
    2: "a KV slot is outside the pool",
    3: "paged attention supports head_dim <= 256 and <= 16 query heads per KV head",
    4: "this build of the CPU kernels has no GEMM of this dtype",
    5: "out of memory for the layers' intermediate tensors",
}


# The packed form each storage type's layers need (kernels/cpu/packed_linear.py).
_PACKED_KIND = {torch.bfloat16: "bf16_panels", torch.float32: "f32_panels"}


def _vector(t: torch.Tensor, dtype: torch.dtype, size: int, what: str) -> int:
    if t.dtype != dtype or t.device.type != "cpu" or t.shape != (size,) or not t.is_contiguous():
        raise ValueError(f"{what} must be a contiguous {str(dtype).removeprefix('torch.')} CPU [{size}] tensor")
    return t.data_ptr()


class CpuDecoderLayers:
    """Runs ``model.layers`` for one step: ``(embeddings, positions) -> (x, residual)``,
    what the loop over the layer modules returns."""

    @staticmethod
    def _why_unsupported(model: LlamaForCausalLM, kv_pool: KVPool) -> str | None:
        """Why this model and pool cannot use the compiled layers, or None when they can."""
        cache = kv_pool.k[0]
        if cache.dtype not in _PACKED_KIND or cache.device.type != "cpu" or kv_pool.layout != "HND":
            return "they need a bfloat16 or float32 CPU KV pool in the HND layout"
        kind = _PACKED_KIND[cache.dtype]
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if attn.o_proj.tp.size > 1 or mlp.down_proj.tp.size > 1:
                return "they do not run tensor-parallel layers"
            for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
                packed = linear.packed_weight
                if packed is None or packed.kind != kind:
                    return (f"they need every linear weight packed for our {str(cache.dtype).removeprefix('torch.')} "
                            "GEMM (bfloat16: AVX512-BF16; float32: AVX2 without AVX-512)")
        try:
            lib = load_kernels()
        except CpuKernelsUnavailable as exc:
            return str(exc)
        return layer_table_mismatch(lib)  # this file and the C++ drifted apart

    def __init__(self, model: LlamaForCausalLM, kv_pool: KVPool) -> None:
        reason = self._why_unsupported(model, kv_pool)
        if reason is not None:
            raise ValueError(f"compiled decoder layers unavailable: {reason}")
        cfg = model.cfg
        first = model.layers[0].self_attn
        hidden, heads, kv_heads, hd = cfg.hidden_size, first.num_heads, first.num_kv_heads, first.head_dim
        cos, sin = first.rotary.cos, first.rotary.sin
        for table in (cos, sin):
            if table.dtype != torch.float32 or table.shape != cos.shape or table.shape[1] != hd or not table.is_contiguous():
                raise ValueError(f"rotary tables must be contiguous float32 [max_positions, {hd}]")
        num_slots, dtype = kv_pool.k[0].shape[1], kv_pool.k[0].dtype
        self._shape = _Shape(hidden, cfg.intermediate_size, heads, kv_heads, hd, num_slots, cos.shape[0],
                             cfg.rms_norm_eps, first.attn.scale, cos.data_ptr(), sin.data_ptr())
        self._keep = [cos, sin]  # the tables' and weights' memory must outlive the pointers
        self._layers = (_Layer * len(model.layers))()
        qkv_width = (heads + 2 * kv_heads) * hd
        widths = {"qkv": (hidden, qkv_width), "o": (heads * hd, hidden), "gate_up": (hidden, 2 * cfg.intermediate_size),
                  "down": (cfg.intermediate_size, hidden)}
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            linears = {"qkv": attn.qkv_proj, "o": attn.o_proj, "gate_up": mlp.gate_up_proj, "down": mlp.down_proj}
            entry = self._layers[i]
            for name, linear in linears.items():
                packed = linear.packed_weight
                if (packed.in_features, packed.out_features) != widths[name] or not packed.data.is_contiguous():
                    raise ValueError(f"layer {i} {name}: packed weight is {packed.out_features}x{packed.in_features}, "
                                     f"expected {widths[name][1]}x{widths[name][0]}")
                setattr(entry, name, packed.data.data_ptr())
                self._keep.append(packed.data)
                if packed.few_rows is not None:  # the same weight as quantized blocks (linear_blocks.cpp)
                    setattr(entry, f"{name}_blocks", packed.few_rows.data_ptr())
                    setattr(entry, f"{name}_format", linear_blocks.FORMS[packed.blocks].index)
                    self._keep.append(packed.few_rows)
            if mlp.down_proj.bias is not None or attn.o_proj.bias is not None or mlp.gate_up_proj.bias is not None:
                raise ValueError("only the qkv projection may have a bias")
            bias = attn.qkv_proj.bias
            entry.qkv_bias = None if bias is None else _vector(bias, dtype, qkv_width, f"layer {i} qkv bias")
            entry.input_norm = _vector(layer.input_layernorm.weight, dtype, hidden, f"layer {i} input norm")
            entry.post_norm = _vector(layer.post_attention_layernorm.weight, dtype, hidden, f"layer {i} post norm")
            k, v = kv_pool.k[i], kv_pool.v[i]
            for cache in (k, v):
                if cache.shape != (kv_heads, num_slots, hd) or not cache.is_contiguous():
                    raise ValueError(f"layer {i}: KV pool tensors must be contiguous [{kv_heads}, {num_slots}, {hd}]")
            entry.k_cache, entry.v_cache = k.data_ptr(), v.data_ptr()
            self._keep += [bias, layer.input_layernorm.weight, layer.post_attention_layernorm.weight, k, v]
        self._pool, self._dtype = kv_pool, dtype
        self._run = getattr(load_kernels(), f"decoder_layers_{SUFFIX[dtype]}")

    def __call__(self, embeddings: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx = get_forward_context()
        batch = ctx.attn_metadata
        if not isinstance(batch, PagedBatch) or ctx.kv_pool is not self._pool:
            raise ValueError("compiled decoder layers need the cpu backend's PagedBatch and the pool they were built on")
        tokens, hidden = embeddings.shape[0], self._shape.hidden
        if (embeddings.dtype != self._dtype or embeddings.device.type != "cpu" or embeddings.shape != (tokens, hidden)
                or not embeddings.is_contiguous()):
            name = str(self._dtype).removeprefix("torch.")
            raise ValueError(f"embeddings must be a contiguous {name} CPU [tokens, {hidden}] tensor")
        batch.check(tokens)
        r2t = batch.req_to_token
        step = _Step(
            tokens, _vector(positions, torch.int64, tokens, "positions"),
            _vector(ctx.out_cache_loc, torch.int64, tokens, "out_cache_loc"), r2t.data_ptr(), r2t.shape[1],
            batch.rows.data_ptr(), batch.prefix.data_ptr(), batch.q_start.data_ptr(), batch.token_req.data_ptr(),
            batch.max_keys,
        )
        # As in the module path, the skip connection starts as the embeddings and is updated
        # in place (nn.Embedding returns a fresh tensor).
        residual = embeddings
        x = torch.empty_like(embeddings)
        status = self._run(ctypes.byref(self._shape), self._layers, len(self._layers), ctypes.byref(step),
                           residual.data_ptr(), x.data_ptr(), torch.get_num_threads())
        if status:
            raise ValueError(f"compiled decoder layers: {_STATUS.get(status, f'status {status}')}")
        return x, residual
