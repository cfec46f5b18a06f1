"""All decoder layers as one compiled call (``runtime/models/cpu_decoder_layers.py``) against
the layer modules it stands in for, in the same engine: the same requests must give
bit-identical tokens and logprobs (it runs the same kernels in the same order), through
prefill, chunked prefill, extends on cached prefixes and decode; and the worker must keep the
modules wherever the compiled layers do not apply. Both storage types: bfloat16 (on our bf16
GEMM, AVX512-BF16) and float32 (on our float32 GEMM, AVX2; forced where the CPU has AVX-512
and float32 would otherwise go to oneDNN), its weights as float32 panels and, where they are
quantized blocks, also as such (taken for a few rows)."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import linear_bf16, linear_f32
from kernels.cpu.paged_attention import last_grouped_tokens, shared_min_keys, shared_min_rows
from runtime.engine import Engine
from runtime.executor.model_input import ForwardInput
from runtime.layers import packed_weights
from tests.gemm_checks import gguf_weight
from tests.tiny_models import build_hf_model, random_prompts, save_hf_folder


@pytest.fixture(params=["bfloat16", "float32"])
def dtype(request, monkeypatch) -> str:
    """The storage type, with its GEMM of our own (skipped where this CPU has none)."""
    if request.param == "bfloat16" and not linear_bf16.available():
        pytest.skip("no bfloat16 GEMM kernel on this CPU (AVX512-BF16)")
    if request.param == "float32":
        if not linear_f32.available():
            pytest.skip("no float32 GEMM kernel on this CPU (AVX2 and FMA)")
        monkeypatch.setattr(linear_f32, "preferred", lambda: True)
    return request.param


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory, model_dir):
    """Qwen2: a qkv bias, an untied head, 2 query heads per KV head, and heads of 64 that do
    not divide the hidden size evenly into them (4 x 64 = 256 wide attention, 192 hidden)."""
    sizes = dict(hidden_size=192, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=320)
    model = build_hf_model("Qwen2", dict(tie_word_embeddings=False), sizes)
    return save_hf_folder(model, tmp_path_factory.mktemp("tiny_qwen2"), model_dir)


@pytest.fixture(scope="module")
def tiny_qwen2_blocks(tmp_path_factory, model_dir):
    """tiny_qwen2 with its decoder layers' linear weights as gguf's Q4_1 dequantizes them but
    the down projections' and the output layer's as Q8_0 does, so float32 layers multiply
    them from their 4-bit and 8-bit blocks (kernels/cpu/linear_blocks.cpp) for a few rows,
    each in its format: the same bits as from float32 panels."""
    sizes = dict(hidden_size=192, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=320)
    model = build_hf_model("Qwen2", dict(tie_word_embeddings=False), sizes)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                kind = "Q4_1" if ".layers." in name and "down_proj" not in name else "Q8_0"
                module.weight.copy_(gguf_weight(kind, *module.weight.shape, seed=len(name)))
    return save_hf_folder(model, tmp_path_factory.mktemp("tiny_qwen2_blocks"), model_dir)


def _generate_both_ways(engine: Engine, prompts: list[list[int]]) -> dict[str, list]:
    """Each way from a cold cache: the first prompt alone, then all of them (the later
    prompts extend it, so their extends start on a cached prefix)."""
    model = engine.worker.model
    compiled = model.compiled_layers
    params = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    results = {}
    try:
        for way, layers in (("compiled", compiled), ("modules", None)):
            model.compiled_layers = layers
            engine.flush_cache()
            first = engine.generate(input_ids=prompts[0], sampling_params=params)
            rest = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True, top_logprobs_num=2)
            assert all(r["meta_info"]["cached_tokens"] >= len(prompts[0]) - 1 for r in rest[:3])
            results[way] = [first["output_ids"]] + [
                (r["output_ids"], r["meta_info"]["output_token_logprobs"], r["meta_info"]["output_top_logprobs"])
                for r in rest]
    finally:
        model.compiled_layers = compiled
    return results


@pytest.mark.parametrize("which", [pytest.param("default", marks=pytest.mark.slow), "tiny_qwen2", "tiny_qwen2_blocks"])
def test_compiled_layers_match_the_modules(which, model_dir, request, dtype):
    path = model_dir if which == "default" else request.getfixturevalue(which)
    engine = Engine(str(path), dtype=dtype, max_total_tokens=20_000, chunked_prefill_size=64)
    try:
        assert engine.worker.model.compiled_layers is not None
        blocks = {p.blocks for p in packed_weights(engine.worker.model)}
        if which == "tiny_qwen2_blocks" and dtype == "float32":
            assert blocks == {"q4_1", "q8_0"}
        base = random_prompts(7, (90,))[0]
        # Two prompts on the first one's prefix, and unrelated ones of mixed lengths.
        prompts = [base, base + random_prompts(8, (30,))[0], base + [11, 12, 13], *random_prompts(9, (5, 140, 33))]
        results = _generate_both_ways(engine, prompts)
        assert results["compiled"] == results["modules"]
        engine.scheduler.check_invariants()
    finally:
        engine.shutdown()


def test_the_modules_stay_where_the_compiled_layers_do_not_apply(tiny_gqa_llama, dtype, monkeypatch):
    """Another backend, or weights on a GEMM not ours (float32 on oneDNN, as on AVX-512 CPUs)."""
    monkeypatch.setattr(linear_f32, "preferred", lambda: False)
    for kwargs in (dict(dtype="float32"), dict(dtype=dtype, attention_backend="torch_native")):
        engine = Engine(str(tiny_gqa_llama), max_total_tokens=2_000, **kwargs)
        try:
            assert engine.worker.model.compiled_layers is None
            assert engine.generate("hello", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
        finally:
            engine.shutdown()


@pytest.mark.parametrize(("slot", "position", "error"), [(1, 10**7, "position"), (None, 0, "slot")])
def test_a_bad_position_or_slot_raises_either_way(tiny_gqa_llama, slot, position, error, dtype):
    """A position past the rotary tables, or a KV slot past the pool (None: num_slots), is a
    ValueError on both paths, raised before anything is written."""
    engine = Engine(str(tiny_gqa_llama), dtype=dtype, max_total_tokens=2_000)
    worker = engine.worker
    compiled = worker.model.compiled_layers
    assert compiled is not None
    loc = torch.tensor([worker.num_slots if slot is None else slot], dtype=torch.int64)
    try:
        for layers in (compiled, None):
            worker.model.compiled_layers = layers
            with pytest.raises(ValueError, match=error):
                worker.run_model(ForwardInput(False, torch.tensor([0]), torch.tensor([5]), torch.tensor([position]),
                                              [0], [1], loc))
    finally:
        worker.model.compiled_layers = compiled
        engine.shutdown()


@pytest.mark.slow
def test_forks_of_one_prompt_match_the_modules(model_dir, dtype):
    """Forks decoding on one prompt, with their shared keys attended once per group (the
    compiled layers find the groups once per step, the modules in every layer's call): the
    same tokens and logprobs both ways, and the groups were used."""
    engine = Engine(str(model_dir), dtype=dtype, max_total_tokens=20_000)
    try:
        base = random_prompts(3, (90,))[0]
        prompts = [base] + [base + [100 + i] for i in range(9)]  # the prompt and 9 forks: 30 query rows a KV head
        # the default row threshold, whatever an engine in this process on AMX tiles lowered it to
        with shared_min_keys(16), shared_min_rows(24):
            results = _generate_both_ways(engine, prompts)
            # bfloat16 on AVX512-BF16 groups up to 16 tokens (48 query rows); float32 on the
            # AVX2 row kernel up to 8 (24 rows), and the 2 left over (6 rows) stay per token.
            assert last_grouped_tokens() == (10 if dtype == "bfloat16" else 8)
        assert results["compiled"] == results["modules"]
    finally:
        engine.shutdown()


def test_the_weight_blocks_benchmark_compares_both_sides(tiny_qwen2_blocks, monkeypatch, capsys):
    """``bench_agent/bench_weight_blocks.py`` on a model with 4- and 8-bit weights: a row per batch."""
    if not linear_f32.available():
        pytest.skip("no float32 GEMM kernel on this CPU (AVX2 and FMA)")
    monkeypatch.setattr(linear_f32, "preferred", lambda: True)
    from bench_agent import bench_weight_blocks

    args = ["--model", str(tiny_qwen2_blocks), "--batch", "1", "3", "--context", "20", "--rounds", "1"]
    assert bench_weight_blocks.main(args) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "x (" in line]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "3"]


def test_the_layer_table_has_the_librarys_layout():
    """``_Layer`` (ctypes) and ``DecoderLayer`` (C++) agree on the entry size, and a library
    whose entries differ (another revision's, in ``bench_kernel_ab``) is refused, not run."""
    import ctypes
    from types import SimpleNamespace

    from bench_agent.bench_kernel_ab import check_layer_table
    from kernels.cpu.build import CpuKernelsUnavailable, load_kernels
    from runtime.models.cpu_decoder_layers import _Layer

    try:
        lib = load_kernels()
    except CpuKernelsUnavailable as err:
        pytest.skip(str(err))
    assert lib.decoder_layer_bytes() == ctypes.sizeof(_Layer)
    check_layer_table(lib, "this build")
    shorter = SimpleNamespace(decoder_layer_bytes=lambda: ctypes.sizeof(_Layer) - 32)
    with pytest.raises(SystemExit, match="-byte entries"):
        check_layer_table(shorter, "old")
    with pytest.raises(SystemExit, match="no decoder_layer_bytes"):
        check_layer_table(SimpleNamespace(), "older")
