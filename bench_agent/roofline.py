"""The fastest a decode step could possibly be on this machine, from two measured numbers.

A decode step reads every weight once (plus each running request's K/V) and does two flops
per weight per batch row (plus the attention's). So no implementation can beat

    floor(batch) = max(bytes read / memory bandwidth,  flops / peak multiply-add rate)

which assumes perfect overlap of reading and computing, and every core retiring one
multiply-add instruction per cycle. It also prices attention's flops at the dtype's dot
rate and takes every request's context as given (the timed steps of ``bench_offline`` see
up to their step count more keys): both can only make it lower. Both rates are measured here, now, with the kernels'
own compiler flags (``kernels/cpu/machine_probe.cpp``): a sequential read of a buffer much
larger than the caches, and independent chains of the instructions the kernels use for
the dtype (vdpbf16ps, and AMX tiles where the CPU has them, for bfloat16; FMA for float32).

At batch 1 the step is memory-bound. At batch B the weights' flops per byte read are B
(bf16) or B/2 (float32), so once B passes the machine's peak/bandwidth ratio the step is
compute-bound and its floor grows linearly with B: on 2 cores with ~30 GB/s and ~460 bf16
GFLOP/s the batch-32 floor is already ~2x the batch-1 floor. ``bench_agent.bench_offline``
prints these floors beside the measured steps.

    python -m bench_agent.roofline            # the default model, batches 1 and 32, 200-token contexts
"""

from __future__ import annotations

import argparse
import ctypes
import time
from dataclasses import dataclass

import torch

from kernels.cpu.build import load_kernels
from runtime.models.config import ModelConfig

_BYTES = {"bfloat16": 2, "float32": 4}
# Per thread and round of probe_bf16_dots: 24 vdpbf16ps, each 16 lanes x 2 products.
BF16_MULTIPLY_ADDS_PER_ROUND = 24 * 16 * 2


@dataclass(frozen=True)
class Machine:
    """Measured rates of this machine with ``threads`` threads."""

    read_gb_s: float  # sequential read of memory, GB/s (1e9 bytes)
    peak_gflop_s: float  # multiply-adds of the dtype's fastest instruction, counting 2 flops each
    dtype: str
    threads: int
    peak_source: str = ""  # which instruction gave the peak ("vdpbf16ps", "AMX tiles", "FMA")


def best_seconds(fn, reps: int) -> float:  # noqa: ANN001
    """The shortest of ``reps`` timed calls of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_read_gb_s(threads: int, mib: int = 256, reps: int = 5) -> float:
    """Best of ``reps`` sequential reads of a ``mib`` MiB buffer (8x a 32 MiB L3 by default)."""
    lib = load_kernels()
    words = torch.ones(mib << 17, dtype=torch.int64)
    lib.probe_read(words.data_ptr(), words.numel(), threads)  # touch every page first
    seconds = best_seconds(lambda: lib.probe_read(words.data_ptr(), words.numel(), threads), reps)
    return words.numel() * 8 / seconds / 1e9


def measure_amx_gflop_s(threads: int, rounds: int = 200_000, reps: int = 5) -> float | None:
    """Multiply-add rate of AMX tiles (tdpbf16ps, 16,384 flops each) with ``threads``
    threads, or None where this CPU, build or OS has none."""
    lib, sink = load_kernels(), ctypes.c_float()
    per_round = lib.probe_amx_tiles(1, threads, ctypes.byref(sink))
    if per_round == 0:
        return None
    seconds = best_seconds(lambda: lib.probe_amx_tiles(rounds, threads, ctypes.byref(sink)), reps)
    return rounds * per_round * 2 * threads / seconds / 1e9


def measure_peak_gflop_s(dtype: str, threads: int, rounds: int = 2_000_000, reps: int = 5) -> float:
    """Multiply-add rate of ``threads`` threads: vdpbf16ps for bfloat16 (64 flops per
    512-bit instruction), vector FMA for float32. Raises if this build has neither."""
    lib, sink = load_kernels(), ctypes.c_float()
    if dtype == "bfloat16":
        if lib.probe_bf16_dots(1, threads, ctypes.byref(sink)):
            raise RuntimeError("this CPU build has no AVX512-BF16 dot products; measure float32 instead")
        flops = rounds * BF16_MULTIPLY_ADDS_PER_ROUND * 2 * threads
        seconds = best_seconds(lambda: lib.probe_bf16_dots(rounds, threads, ctypes.byref(sink)), reps)
    elif dtype == "float32":
        per_round = lib.probe_f32_fmas(1, threads, ctypes.byref(sink))  # multiply-adds per thread
        if per_round == 0:
            raise RuntimeError("this CPU build has no AVX2/AVX-512 FMA")
        flops = rounds * per_round * 2 * threads
        seconds = best_seconds(lambda: lib.probe_f32_fmas(rounds, threads, ctypes.byref(sink)), reps)
    else:
        raise ValueError(f"dtype must be bfloat16 or float32, got {dtype!r}")
    return flops / seconds / 1e9


def measure(dtype: str, threads: int | None = None) -> Machine:
    """The read rate, and the dtype's best multiply-add rate: for bfloat16 the faster of
    vdpbf16ps and AMX tiles (where the CPU has them), since the GEMM uses whichever wins."""
    threads = threads or torch.get_num_threads()
    peak = measure_peak_gflop_s(dtype, threads)
    source = "vdpbf16ps" if dtype == "bfloat16" else "FMA"
    amx = measure_amx_gflop_s(threads) if dtype == "bfloat16" else None
    if amx is not None and amx > peak:
        peak, source = amx, "AMX tiles"
    return Machine(measure_read_gb_s(threads), peak, dtype, threads, source)


@dataclass(frozen=True)
class StepCost:
    """What one decode step of a model must read and compute, per batch row and per key."""

    weight_params: int  # every matrix product's weights, the output head included
    kv_bytes_per_key: int  # K and V of one context token, all layers
    attention_flops_per_key: int  # q.k and p.v of one query token against one key, all layers
    dtype_bytes: int

    @classmethod
    def of(cls, cfg: ModelConfig, dtype: str) -> StepCost:
        h, hd, layers = cfg.hidden_size, cfg.head_dim, cfg.num_layers
        q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * cfg.intermediate_size
        return cls(
            weight_params=layers * per_layer + cfg.vocab_size * h,
            kv_bytes_per_key=layers * 2 * kv * _BYTES[dtype],
            attention_flops_per_key=layers * 4 * q,
            dtype_bytes=_BYTES[dtype],
        )

    def floor_ms(self, machine: Machine, batch: int, context: int) -> float:
        """The step's time if it read its bytes at the measured bandwidth while computing
        its flops at the measured peak, whichever takes longer."""
        read = self.weight_params * self.dtype_bytes + batch * context * self.kv_bytes_per_key
        flops = batch * (2 * self.weight_params + context * self.attention_flops_per_key)
        return max(read / (machine.read_gb_s * 1e9), flops / (machine.peak_gflop_s * 1e9)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="HF folder; default: the bundled SmolLM2-135M-Instruct.")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="Weights and K/V dtype.")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="Batch sizes (running requests).")
    ap.add_argument("--context", type=int, default=200, help="Tokens each request attends over.")
    ap.add_argument("--threads", type=int, default=None, help="Threads (default: torch's, i.e. the cores).")
    args = ap.parse_args()

    from runtime.model_loader.default_model import resolve_model_path
    from runtime.model_loader.weights import load_hf_config

    cfg = ModelConfig.from_hf(load_hf_config(resolve_model_path(args.model_path)))
    machine = measure(args.dtype, args.threads)
    cost = StepCost.of(cfg, args.dtype)
    print(f"{machine.threads} threads: read {machine.read_gb_s:.1f} GB/s, {args.dtype} multiply-adds "
          f"{machine.peak_gflop_s:.0f} GFLOP/s ({machine.peak_source}); {cost.weight_params / 1e6:.1f}M weights, "
          f"{args.context}-token contexts\n")
    print("| batch | floor of a decode step (ms) | vs batch 1 |\n|---|---|---|")
    base = cost.floor_ms(machine, 1, args.context)
    for b in args.batch:
        floor = cost.floor_ms(machine, b, args.context)
        print(f"| {b} | {floor:.2f} | {floor / base:.2f} |")


if __name__ == "__main__":
    main()
