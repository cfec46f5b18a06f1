"""Tensor parallel on CPU (gloo): the split layers and uneven head groups must reproduce
the unsplit model."""

from __future__ import annotations

import pytest
import torch

from runtime.distributed import split_range

PROMPTS = ["The capital of France is", "def add(a, b):", "Three colours of the rainbow are", "Hello"]


@pytest.mark.parametrize(("n", "size"), [(3, 2), (9, 2), (1536, 2), (8, 3), (5, 5), (7, 4)])
def test_split_range_covers_everything_once(n, size):
    parts = [split_range(n, size, r) for r in range(size)]
    assert sum(c for _, c in parts) == n
    assert [s for s, _ in parts] == [sum(c for _, c in parts[:r]) for r in range(size)]
    assert max(c for _, c in parts) - min(c for _, c in parts) <= 1


@pytest.mark.slow
def test_tp2_greedy_equals_tp1(engine, model_dir):
    from runtime.engine import Engine

    params = {"max_new_tokens": 24, "temperature": 0}
    ref = engine.generate(PROMPTS, params, return_logprob=True)
    with Engine(str(model_dir), dtype="float32", max_total_tokens=8000, tp_size=2) as tp2:
        assert tp2.worker.tp.size == 2
        # SmolLM2-135M's 3 KV heads split 2 + 1: rank 0 holds 2 KV heads, 6 query heads.
        attn = tp2.worker.model.layers[0].self_attn
        assert (attn.num_kv_heads, attn.num_heads) == (2, 6)
        got = tp2.generate(PROMPTS, params, return_logprob=True)
        # constrained rows (masks on rank 0, jump-forward extends on every rank) as well
        schema = {"json_schema": '{"type": "object", "properties": {"a": {"type": "integer", "maximum": 99}}}'}
        tp_json = tp2.generate(PROMPTS, {**params, **schema})
    for j, want in zip(tp_json, engine.generate(PROMPTS, {**params, **schema}), strict=True):
        assert j["output_ids"] == want["output_ids"]
    for g, r in zip(got, ref, strict=True):
        assert g["output_ids"] == r["output_ids"]
        glp = torch.tensor([t[0] for t in g["meta_info"]["output_token_logprobs"]])
        rlp = torch.tensor([t[0] for t in r["meta_info"]["output_token_logprobs"]])
        assert torch.allclose(glp, rlp, atol=1e-3)


def test_tp_larger_than_kv_heads_is_refused(model_dir):
    from runtime.distributed import TPInfo
    from runtime.model_loader.weights import load_hf_config
    from runtime.models.config import ModelConfig
    from runtime.models.llama import LlamaForCausalLM

    cfg = ModelConfig.from_hf(load_hf_config(model_dir))
    with torch.device("meta"), pytest.raises(ValueError, match="exceeds the model's 3 KV heads"):
        LlamaForCausalLM(cfg, TPInfo(rank=0, size=4))


def test_tp_larger_than_kv_heads_is_refused_before_any_rank_starts(model_dir, monkeypatch):
    from runtime.engine import Engine
    from runtime.executor import tp_worker

    def no_spawn(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(tp_worker.TPPeers, "__init__", no_spawn)
    with pytest.raises(ValueError, match="tp_size 4 exceeds the model's 3 KV heads"):
        Engine(str(model_dir), dtype="float32", max_total_tokens=1000, tp_size=4)


@pytest.mark.slow
def test_a_script_without_the_main_guard_fails_fast_and_says_why(tmp_path, model_dir):
    """The other ranks start with multiprocessing's spawn, which imports the script again:
    without the ``__main__`` guard a rank dies before it runs (multiprocessing's bootstrap
    error), and rank 0 waited in the process group's rendezvous for it (120 s), silently.
    Now the Engine raises, naming the guard, as soon as that rank has exited."""
    import subprocess
    import sys
    import time

    script = tmp_path / "no_guard.py"
    script.write_text("from runtime import Engine\n"
                      f"Engine({str(model_dir)!r}, dtype='float32', max_total_tokens=2000, tp_size=2)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert done.returncode != 0
    assert "tensor-parallel rank 1 exited" in done.stderr and '__name__ == "__main__"' in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - started < 90
