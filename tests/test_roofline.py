"""The roofline of ``bench_agent.roofline``: what a decode step must read and compute, checked
against transformers' own modules and the KV pool, the floor's arithmetic, and the machine
probes it times (``kernels/cpu/machine_probe.cpp``)."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch
from torch import nn

from bench_agent.roofline import (
    BF16_MULTIPLY_ADDS_PER_ROUND,
    Machine,
    StepCost,
    measure_peak_gflop_s,
    measure_read_gb_s,
)
from kernels.cpu import linear_bf16
from kernels.cpu.build import load_kernels
from runtime.executor.kv_pool import KVPool
from runtime.models.config import ModelConfig
from tests.tiny_models import build_hf_model


@pytest.mark.parametrize(
    ("family", "extra"),
    [("Llama", dict(tie_word_embeddings=True)), ("Qwen2", dict(tie_word_embeddings=False)), ("Mistral", {})],
)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_step_cost_counts_what_the_model_holds(family, extra, dtype):
    hf = build_hf_model(family, extra, dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=128))
    cfg = ModelConfig.from_hf(hf.config.to_dict())
    cost = StepCost.of(cfg, dtype)
    # Every matrix product's weight, the head included (tied or not): transformers' nn.Linear modules.
    assert cost.weight_params == sum(m.weight.numel() for m in hf.modules() if isinstance(m, nn.Linear))
    torch_dtype = getattr(torch, dtype)
    assert cost.kv_bytes_per_key == KVPool.bytes_per_slot(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch_dtype)
    # q.k and p.v: 2 flops per query-head dimension each, per layer.
    assert cost.attention_flops_per_key == cfg.num_layers * 4 * cfg.num_heads * cfg.head_dim
    assert cost.dtype_bytes == torch.finfo(torch_dtype).bits // 8


def test_floor_is_the_slower_of_reading_and_computing():
    cost = StepCost(weight_params=1_000_000, kv_bytes_per_key=1_000, attention_flops_per_key=100, dtype_bytes=2)
    machine = Machine(read_gb_s=10.0, peak_gflop_s=100.0, dtype="bfloat16", threads=1)
    # Batch 1, 50 keys: 2.05 MB at 10 GB/s = 0.205 ms; 2.005 MFLOP at 100 GFLOP/s = 0.02 ms.
    assert cost.floor_ms(machine, 1, 50) == pytest.approx(0.205)
    # Batch 64: 2 MB + 3.2 MB = 0.52 ms; 64 x (2 MFLOP + 5 kFLOP) = 128.32 MFLOP = 1.2832 ms.
    assert cost.floor_ms(machine, 64, 50) == pytest.approx(1.2832)
    # Compute-bound from here on: doubling the batch doubles the floor.
    assert cost.floor_ms(machine, 128, 50) == pytest.approx(2 * cost.floor_ms(machine, 64, 50))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_read_probe_reads_every_word(threads):
    words = torch.randint(0, 1 << 40, (100_003,), dtype=torch.int64)
    assert load_kernels().probe_read(words.data_ptr(), words.numel(), threads) == int(words.sum())
    assert load_kernels().probe_read(words.data_ptr(), 0, threads) == 0


def test_rates_are_measured():
    read = measure_read_gb_s(threads=1, mib=16, reps=2)
    assert math.isfinite(read) and read > 0.1
    has_fma = load_kernels().probe_f32_fmas(1, 1, ctypes.byref(ctypes.c_float())) > 0
    if has_fma:
        assert measure_peak_gflop_s("float32", threads=1, rounds=10_000, reps=2) > 0.1
    if linear_bf16.available():
        assert measure_peak_gflop_s("bfloat16", threads=1, rounds=10_000, reps=2) > 0.1
    else:
        with pytest.raises(RuntimeError, match="AVX512-BF16"):
            measure_peak_gflop_s("bfloat16", threads=1, rounds=10)
    with pytest.raises(ValueError, match="dtype"):
        measure_peak_gflop_s("float16", threads=1)


def test_probes_do_the_multiply_adds_the_flop_counts_assume():
    """The sink is the sum of every accumulator, i.e. of every product the probe made, so
    it counts the multiply-adds that the peak's flop count assumes (2 threads, 100 rounds)."""
    lib, sink = load_kernels(), ctypes.c_float()
    per_round = lib.probe_f32_fmas(100, 2, ctypes.byref(sink))
    if per_round:  # each multiply-add adds 1.0 * 1e-3
        assert sink.value == pytest.approx(100 * per_round * 2 * 1e-3, rel=1e-3)
    if lib.probe_bf16_dots(100, 2, ctypes.byref(sink)) == 0:  # each product is bf16 1.0 x bf16 2^-7
        assert sink.value == pytest.approx(100 * BF16_MULTIPLY_ADDS_PER_ROUND * 2 * 2**-7, rel=1e-3)


def test_the_amx_probe_does_the_multiply_adds_its_count_assumes():
    """Each tile product adds 32 x (bf16 1.0 x 2^-7) to every accumulator element, so the
    sink counts the probe's multiply-adds; without AMX it says so (0) and no rate is given."""
    from bench_agent.roofline import measure_amx_gflop_s

    lib, sink = load_kernels(), ctypes.c_float()
    per_round = lib.probe_amx_tiles(100, 2, ctypes.byref(sink))
    if per_round == 0:
        assert measure_amx_gflop_s(threads=1, rounds=10, reps=1) is None
        pytest.skip("this CPU (or its build or OS) has no AMX tiles")
    assert per_round == 4 * 16 * 16 * 32
    assert sink.value == pytest.approx(100 * per_round * 2 * 2**-7, rel=1e-6)
    assert measure_amx_gflop_s(threads=1, rounds=1000, reps=2) > 0.1


def test_the_bf16_peak_is_the_faster_instruction(monkeypatch):
    import bench_agent.roofline as rl

    monkeypatch.setattr(rl, "measure_read_gb_s", lambda threads: 30.0)
    monkeypatch.setattr(rl, "measure_peak_gflop_s", lambda dtype, threads: 450.0)
    monkeypatch.setattr(rl, "measure_amx_gflop_s", lambda threads: 2000.0)
    assert (rl.measure("bfloat16", 2).peak_gflop_s, rl.measure("bfloat16", 2).peak_source) == (2000.0, "AMX tiles")
    assert rl.measure("float32", 2).peak_source == "FMA"
    monkeypatch.setattr(rl, "measure_amx_gflop_s", lambda threads: None)
    assert (rl.measure("bfloat16", 2).peak_gflop_s, rl.measure("bfloat16", 2).peak_source) == (450.0, "vdpbf16ps")
