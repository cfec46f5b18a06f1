"""The bf16 GEMM kernel choice (``kernels/cpu/gemm_choice.py``): measured crossovers, their
cache beside the compiled library, the threshold a model's shapes set, and the worker
stating what it chose. Which kernel a threshold sends a product to is checked bit for bit in
``tests/test_cpu_packed_linear.py``."""

from __future__ import annotations

import json

import pytest
import torch

from kernels.cpu import gemm_choice, linear_bf16, linear_f32
from kernels.cpu.build import CpuKernelsUnavailable

needs_amx = pytest.mark.skipif(not gemm_choice.amx_available(),
                               reason="this CPU (or its build or OS) has no AMX tiles: nothing to choose between")


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    path = tmp_path / "kernels.gemm.json"
    monkeypatch.setattr(gemm_choice, "_cache_file", lambda: path)
    return path


@pytest.fixture
def restore_threshold():
    previous = gemm_choice.set_amx_min_rows(gemm_choice.NEVER)
    gemm_choice.set_amx_min_rows(previous)
    previous_widen = gemm_choice.set_widen_min_rows(gemm_choice.NEVER)
    gemm_choice.set_widen_min_rows(previous_widen)
    yield
    gemm_choice.set_amx_min_rows(previous)
    gemm_choice.set_widen_min_rows(previous_widen)


needs_bf16 = pytest.mark.skipif(not linear_bf16.available(), reason="no bfloat16 GEMM kernel on this CPU")


@needs_bf16
def test_the_widened_kernels_crossovers_are_measured_once_and_cached_apart_from_amxs(cache_file, monkeypatch):
    """The widened (float32 FMA) kernel is measured on every AVX512-BF16 CPU, under its own
    keys: its crossover is a candidate row count, or NEVER where vdpbf16ps stays faster."""
    found = gemm_choice.crossovers([(576, 960), (64, 32)], threads=2, challenger="widened")
    for rows in found.values():
        assert rows in gemm_choice.CANDIDATE_ROWS or rows == gemm_choice.NEVER
    assert json.loads(cache_file.read_text()) == {"widened:576x960@2": found[(576, 960)],
                                                   "widened:64x32@2": found[(64, 32)]}
    monkeypatch.setattr(gemm_choice, "measure_crossover", lambda *a, **k: pytest.fail("measured again"))
    assert gemm_choice.crossovers([(64, 32)], threads=2, challenger="widened") == {(64, 32): found[(64, 32)]}


def test_the_widened_threshold_is_the_largest_crossover_and_is_described(monkeypatch, restore_threshold):
    monkeypatch.setattr(gemm_choice, "crossovers",
                        lambda shapes, threads=None, challenger="amx": {s: s[0] for s in shapes})
    assert gemm_choice.choose_widen_for([(3, 10), (6, 10)]) == 6
    assert gemm_choice.set_widen_min_rows(gemm_choice.NEVER) == 6
    assert gemm_choice.describe(gemm_choice.NEVER, widen_rows=6).startswith(
        "bf16 GEMM on AVX512-BF16 vectors (float32 FMAs on widened weights from 6 rows")
    assert gemm_choice.describe(4, True, 2) == ("bf16 GEMM on AMX tiles from 4 rows, AVX512-BF16 vectors "
                                                 "(prefetching at decode sizes; float32 FMAs on widened weights "
                                                 "from 2 rows) below")


@needs_amx
def test_crossovers_are_measured_once_then_read_from_the_cache(cache_file, monkeypatch):
    found = gemm_choice.crossovers([(576, 960), (64, 32), (576, 960)], threads=2)
    assert set(found) == {(576, 960), (64, 32)}
    for rows in found.values():
        assert rows in gemm_choice.CANDIDATE_ROWS or rows == gemm_choice.NEVER
    assert json.loads(cache_file.read_text()) == {"576x960@2": found[(576, 960)], "64x32@2": found[(64, 32)]}

    def must_not_measure(*args):  # noqa: ANN002
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(gemm_choice, "measure_crossover", must_not_measure)
    assert gemm_choice.crossovers([(64, 32)], threads=2) == {(64, 32): found[(64, 32)]}
    # another thread count is another measurement
    monkeypatch.undo()
    monkeypatch.setattr(gemm_choice, "_cache_file", lambda: cache_file)
    gemm_choice.crossovers([(64, 32)], threads=1)
    assert "64x32@1" in json.loads(cache_file.read_text())


@needs_amx
def test_a_corrupt_cache_is_measured_anew(cache_file):
    cache_file.write_text("{not json")
    assert gemm_choice.crossovers([(64, 32)], threads=1)[(64, 32)] >= 1
    assert "64x32@1" in json.loads(cache_file.read_text())


@needs_amx
def test_amx_wins_from_a_few_rows_on_a_prefill_sized_shape():
    """On the default model's MLP shape the tiles must win well before 16 rows (they are
    ~6x faster at 16 rows on AMX machines); a kernel that broke the AMX path's speed fails here."""
    assert gemm_choice.measure_crossover(576, 1536, threads=torch.get_num_threads()) <= 8


def test_without_amx_every_product_stays_on_the_vector_kernel(cache_file, monkeypatch, restore_threshold):
    monkeypatch.setattr(gemm_choice, "amx_available", lambda: False)
    assert gemm_choice.crossovers([(576, 960)]) == {(576, 960): gemm_choice.NEVER}
    assert not cache_file.exists()
    assert gemm_choice.choose_for([(576, 960)]) == gemm_choice.NEVER
    assert gemm_choice.describe(gemm_choice.NEVER) == "bf16 GEMM on AVX512-BF16 vectors (no AMX here)"
    with pytest.raises(CpuKernelsUnavailable, match="AMX"), gemm_choice.forced("amx"):
        pass


def test_the_largest_crossover_of_a_models_shapes_is_set(monkeypatch, restore_threshold):
    monkeypatch.setattr(gemm_choice, "crossovers",
                        lambda shapes, threads=None, challenger="amx": {s: s[0] for s in shapes})
    assert gemm_choice.choose_for([(3, 10), (8, 10), (2, 10)]) == 8
    assert gemm_choice.set_amx_min_rows(gemm_choice.NEVER) == 8
    assert gemm_choice.describe(8) == "bf16 GEMM on AMX tiles from 8 rows, AVX512-BF16 vectors below"


@pytest.fixture
def restore_small_prefetch():
    previous = gemm_choice.set_small_prefetch(0)
    gemm_choice.set_small_prefetch(previous)
    yield
    gemm_choice.set_small_prefetch(previous)


@needs_bf16
def test_the_small_row_prefetch_is_measured_once_per_weight_size_then_read_from_the_cache(
        cache_file, monkeypatch, restore_small_prefetch):
    gen = torch.Generator().manual_seed(0)
    weights = [(linear_bf16.pack(torch.randn(64, 96, generator=gen).bfloat16()), 96, 64) for _ in range(3)]
    assert isinstance(gemm_choice.prefetch_wins(weights, threads=1, rounds=2), bool)  # a real measurement runs
    calls = []
    monkeypatch.setattr(gemm_choice, "prefetch_wins", lambda w, threads: calls.append(threads) or True)
    assert gemm_choice.choose_small_prefetch(weights, threads=2) is True
    assert gemm_choice.set_small_prefetch(0) == 1  # it was turned on
    assert gemm_choice.choose_small_prefetch(weights, threads=2) is True
    assert calls == [2]
    assert json.loads(cache_file.read_text()) == {"prefetch:0MiB@2": 1}
    monkeypatch.setattr(gemm_choice, "prefetch_wins", lambda w, threads: False)
    assert gemm_choice.choose_small_prefetch(weights, threads=1) is False
    assert gemm_choice.set_small_prefetch(0) == 0
    assert gemm_choice.describe(4, True) == ("bf16 GEMM on AMX tiles from 4 rows, "
                                              "AVX512-BF16 vectors (prefetching at decode sizes) below")


def test_forced_names_a_kernel_and_restores_the_threshold(restore_threshold):
    with pytest.raises(ValueError, match="vector"), gemm_choice.forced("tiles"):
        pass
    gemm_choice.set_amx_min_rows(5)
    gemm_choice.set_widen_min_rows(7)
    with gemm_choice.forced("vector"):
        assert gemm_choice.set_amx_min_rows(gemm_choice.NEVER) == gemm_choice.NEVER
        assert gemm_choice.set_widen_min_rows(gemm_choice.NEVER) == gemm_choice.NEVER
    with gemm_choice.forced("widened"):
        assert gemm_choice.set_amx_min_rows(gemm_choice.NEVER) == gemm_choice.NEVER
        assert gemm_choice.set_widen_min_rows(1) == 1
    assert gemm_choice.set_amx_min_rows(5) == 5
    assert gemm_choice.set_widen_min_rows(7) == 7


@pytest.mark.skipif(not linear_bf16.available(), reason="no bfloat16 GEMM kernel on this CPU")
def test_the_worker_states_its_gemm(tiny_gqa_llama, restore_threshold):
    from runtime.engine import Engine

    engine = Engine(str(tiny_gqa_llama), dtype="bfloat16", max_total_tokens=2000)
    try:
        expected = "from" if gemm_choice.amx_available() else "vectors"
        assert engine.worker.gemm.startswith("bf16 GEMM on") and expected in engine.worker.gemm
    finally:
        engine.shutdown()


def test_the_worker_states_its_float32_gemm(tiny_gqa_llama):
    """Float32 weights: our AVX2 kernel on CPUs without AVX-512, oneDNN elsewhere."""
    from runtime.engine import Engine

    fp32 = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=2000)
    try:
        ours = "float32 GEMM of our own on packed weights (AVX2 FMAs)"
        assert fp32.worker.gemm == (ours if linear_f32.preferred() else "oneDNN GEMM on packed weights")
    finally:
        fp32.shutdown()


@pytest.mark.skipif(not linear_bf16.available(), reason="no bfloat16 GEMM kernel on this CPU")
def test_the_worker_warns_when_amx_is_here_but_measured_off(tiny_gqa_llama, restore_threshold, monkeypatch, caplog):
    from runtime.engine import Engine

    monkeypatch.setattr(gemm_choice, "amx_available", lambda: True)
    monkeypatch.setattr(gemm_choice, "crossovers",
                        lambda shapes, threads=None, challenger="amx": dict.fromkeys(shapes, gemm_choice.NEVER))
    with caplog.at_level("WARNING"):
        engine = Engine(str(tiny_gqa_llama), dtype="bfloat16", max_total_tokens=2000)
    engine.shutdown()
    assert "AMX tiles, but the measured GEMM choice" in caplog.text


def test_a_noisy_loss_neither_moves_the_crossover_nor_turns_the_tiles_off(monkeypatch):
    """The crossover is the first size where the tiles win, given they win at 16 rows; a
    measurement where they lose at 16 is repeated (another process can take a core for a
    moment), and only three such losses give NEVER."""
    lose, noisy = [False] * len(gemm_choice.CANDIDATE_ROWS), [False, False, True, False, True, True, True, True]
    answers = iter([lose, noisy])
    monkeypatch.setattr(gemm_choice, "_challenger_wins", lambda *args: next(answers))
    assert gemm_choice.measure_crossover(64, 32, threads=1) == 3
    monkeypatch.setattr(gemm_choice, "_challenger_wins", lambda *args: lose)
    assert gemm_choice.measure_crossover(64, 32, threads=1) == gemm_choice.NEVER


@pytest.fixture
def restore_grouping():
    from kernels.cpu.paged_attention import (
        DEFAULT_SHARED_MIN_KEYS,
        shared_min_keys,
        shared_min_rows,
    )

    with shared_min_rows(24), shared_min_keys(DEFAULT_SHARED_MIN_KEYS):  # the kernel's defaults, restored after
        yield


@pytest.mark.skipif(not linear_bf16.available(), reason="no bfloat16 GEMM kernel on this CPU")
@pytest.mark.parametrize("on_amx", [True, False])
def test_the_worker_groups_smaller_forks_where_the_gemms_run_on_amx(tiny_gqa_llama, restore_threshold,
                                                                    restore_grouping, monkeypatch, on_amx):
    """Decode forks share their keys' reads from 6 query rows (2 forks of the default model)
    and 256 keys where the GEMMs run on AMX tiles; elsewhere the kernel's defaults (24 rows,
    1,024 keys) stay."""
    from kernels.cpu.build import load_kernels
    from runtime.engine import Engine

    monkeypatch.setattr(gemm_choice, "choose_for", lambda shapes, threads=None: 3 if on_amx else gemm_choice.NEVER)
    monkeypatch.setattr(gemm_choice, "amx_available", lambda: on_amx)
    engine = Engine(str(tiny_gqa_llama), dtype="bfloat16", max_total_tokens=2000)
    engine.shutdown()
    lib = load_kernels()
    rows, keys = lib.paged_attention_set_shared_min_rows(24), lib.paged_attention_set_shared_min_keys(-1)
    assert (rows, keys) == ((6, 256) if on_amx else (24, -1))  # -1: each K/V storage type's default


def test_a_float32_engine_leaves_the_grouping_settings_alone(tiny_gqa_llama, restore_grouping):
    """Float32 K/V groups decode forks from fewer shared keys by the kernel's own default for
    that storage type: an in-process float32 engine sets nothing that later bfloat16 engines
    in the process would inherit."""
    from kernels.cpu.build import load_kernels
    from runtime.engine import Engine

    engine = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=2000)
    engine.shutdown()
    lib = load_kernels()
    assert (lib.paged_attention_set_shared_min_rows(24), lib.paged_attention_set_shared_min_keys(-1)) == (24, -1)
