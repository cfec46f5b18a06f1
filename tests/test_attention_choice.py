"""The bf16 extend attention's choice between vdpbf16ps and widened float32 FMAs
(``kernels/cpu/attention_choice.py``): which one a setting runs, told apart by their
rounding; the measurement, its cache, and the worker stating what it chose. Both variants
against the reference: ``tests/test_cpu_attention.py`` (``native_widened``)."""

from __future__ import annotations

import json

import pytest
import torch

from kernels.cpu import attention_choice, gemm_choice
from kernels.cpu.build import find_compiler

if find_compiler() is None or not attention_choice.applies(64):
    pytest.skip("no bf16 extend tasks in this CPU's build: nothing to choose between", allow_module_level=True)

from kernels.cpu.paged_attention import PagedBatch, paged_attention  # noqa: E402


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    path = tmp_path / "kernels.gemm.json"
    monkeypatch.setattr(gemm_choice, "_cache_file", lambda: path)
    return path


@pytest.fixture(autouse=True)
def restore_setting():
    with attention_choice.forced(False):
        yield


def _near_tie_output() -> float:
    """Head 0, dim 0 of the first of two query tokens after one cached token: it sees keys
    whose scores differ by 1/1024 after scaling and whose values are +1 and -1, so the exact
    output is (1 - e^(-1/1024)) / (1 + e^(-1/1024)) ~ 4.9e-4; with both probabilities rounded
    to bfloat16 (vdpbf16ps's pairs) they are both 1 and the output is exactly 0."""
    dim, slots = 64, 4
    k_cache, v_cache = torch.zeros(1, slots, dim), torch.zeros(1, slots, dim)
    k_cache[0, 1, 0], k_cache[0, 2, 0] = 2.0**-7, 0.0  # scale 1/8: scores 2^-10 apart
    v_cache[0, 1, 0], v_cache[0, 2, 0], v_cache[0, 3, 0] = 1.0, -1.0, 5.0
    q = torch.zeros(2, 1, dim)
    q[:, 0, 0] = 1.0
    table = torch.tensor([[1, 2, 3]])
    batch = PagedBatch.build(table, torch.zeros(1, dtype=torch.int64), [1], [2])
    out = paged_attention(q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), batch, dim**-0.5)
    return out[0, 0, 0].item()


def test_the_setting_picks_the_variant():
    """Told apart by a near tie that only float32 probabilities resolve."""
    assert _near_tie_output() == 0.0
    with attention_choice.forced(True):
        assert _near_tie_output() == pytest.approx(4.88e-4, rel=0.01)
    assert _near_tie_output() == 0.0


def test_the_choice_is_measured_once_cached_and_applied(cache_file, monkeypatch):
    widened = attention_choice.choose_for(9, 3, 64)
    assert json.loads(cache_file.read_text()) == {
        f"attention-widened:9x3x64@{torch.get_num_threads()}": int(widened)}
    assert (_near_tie_output() != 0.0) == widened
    monkeypatch.setattr(attention_choice, "widened_wins", lambda *a, **k: pytest.fail("measured again"))
    assert attention_choice.choose_for(9, 3, 64) == widened
    # A cached answer is what the process runs, whichever it is.
    cache_file.write_text(json.dumps({f"attention-widened:9x3x64@{torch.get_num_threads()}": int(not widened)}))
    assert attention_choice.choose_for(9, 3, 64) == (not widened)
    assert (_near_tie_output() != 0.0) == (not widened)


def test_no_choice_for_head_sizes_the_extend_tasks_do_not_take(cache_file):
    with attention_choice.forced(True):
        assert attention_choice.choose_for(4, 4, 32) is False
        assert _near_tie_output() == 0.0
    assert not cache_file.exists()


def test_the_measurement_leaves_the_settings_as_they_were():
    lib = attention_choice.load_kernels()
    previous_amx = lib.paged_attention_set_amx_min_tokens(7)
    try:
        with attention_choice.forced(True):
            assert attention_choice.widened_wins(9, 3, 64, reps=1, new_tokens=32, cached_tokens=32) in (True, False)
            assert _near_tie_output() != 0.0
        assert lib.paged_attention_set_amx_min_tokens(7) == 7
    finally:
        lib.paged_attention_set_amx_min_tokens(previous_amx)


@pytest.mark.parametrize("widened", [True, False])
def test_the_worker_applies_and_states_the_cached_choice(tiny_gqa_llama, cache_file, widened):
    """The worker chooses for its model's head geometry (3 query heads on 1 KV head, size
    64), runs it and says it in the ready line's words."""
    from runtime.engine import Engine

    cache_file.write_text(json.dumps({f"attention-widened:3x1x64@{torch.get_num_threads()}": int(widened)}))
    engine = Engine(str(tiny_gqa_llama), dtype="bfloat16", max_total_tokens=2000)
    try:
        assert engine.worker.attention == ("extends on float32 FMAs" if widened else "")
        assert (_near_tie_output() != 0.0) == widened
    finally:
        engine.shutdown()
