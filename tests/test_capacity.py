"""``forkserve capacity``: its figures against the model's own files and the server's pool
rule, and the planning arithmetic on numbers worked out by hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from runtime.capacity import Plan, kv_bytes_per_token, largest_pool, num_parameters, pool_tokens
from runtime.executor.kv_pool import KVPool
from runtime.model_loader.weights import load_hf_config
from runtime.models.config import ModelConfig


def test_parameters_and_kv_bytes_match_the_default_model(model_dir):
    cfg = ModelConfig.from_hf(load_hf_config(model_dir))
    stored = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                stored += math.prod(f.get_slice(name).get_shape())
    assert num_parameters(cfg) == stored
    for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        assert kv_bytes_per_token(cfg, dtype) == KVPool.bytes_per_slot(cfg.num_layers, cfg.num_kv_heads,
                                                                         cfg.head_dim, torch_dtype)


def test_plan_arithmetic():
    # 1,000 bytes a token; a 10,000-token pool; programs of 1,200 tokens, 200 of them shared
    plan = Plan(1000, 0, 10_000, 1_200, 200)
    assert plan.programs_per_replica == (10_000 - 200) // 1_000 == 9
    assert plan.replicas_for(9) == 1 and plan.replicas_for(10) == 2 and plan.replicas_for(90) == 10
    assert Plan(1000, 0, 1_000, 1_200, 0).replicas_for(5) is None  # one context does not fit
    assert pool_tokens(1000, None, 1.0) == 2**30 // 1000 and pool_tokens(1000, 777, 1.0) == 777
    assert largest_pool(1000, weight_bytes=500_000, device_bytes=10_000_000, usable=0.9) == 8_500


def test_the_command_prints_the_servers_pool(model_dir):
    """The default 1 GiB pool in bfloat16 is what ``forkserve serve`` reports at start-up
    for the default model: 46,603 tokens."""
    done = subprocess.run([sys.executable, "-m", "runtime.cli", "capacity", "--json", "--dtype", "bfloat16",
                           "--context-tokens", "4000", "--shared-prefix-tokens", "1000", "--concurrent-programs", "100"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kv_bytes_per_token"] == 23_040 and report["pool_tokens"] == 46_603
    assert report["programs_per_replica"] == (46_603 - 1000) // 3000 == 15
    assert report["replicas_needed"] == 7


def test_the_command_says_when_nothing_fits_and_when_a_context_is_beyond_the_model(model_dir, capsys):
    """No pool beside the weights is said as such (not ``--kv-cache-memory 0.0``, which serve
    refuses); a program context past the model's own is pointed out. (In this process: the
    command as a process of its own is run by the test above.)"""
    from runtime.cli import main

    def run(*argv: str) -> str:
        assert main(["capacity", *argv]) == 0
        return capsys.readouterr().out

    assert "none: the weights leave no room for a KV pool" in run("--device-memory", "0.1")
    assert "100,000 tokens of context are beyond the model's 8,192" in run("--context-tokens", "100000")
    assert isinstance(json.loads(run("--json", "--device-memory", "0.1"))["device_bytes"], int)
    # a pool the device cannot hold is planned with, but said to be so
    assert "this pool (1000.00 GiB) does not fit beside the weights" in run("--kv-cache-memory", "1000")
    assert "does not fit" not in run("--kv-cache-memory", "1", "--device-memory", "80")
    # a pool too small for one program says so, not only "0 programs at once"
    assert "one program's 4,096 tokens of context do not fit in this pool of 100" in run("--max-total-tokens", "100")
    assert "do not fit in this pool" not in run("--max-total-tokens", "5000")


def test_the_paper_weights_are_what_a_cpu_server_holds(model_dir):
    """``weight_bytes`` on paper (config only) against the memory the weights of a float32
    engine on the ``cpu`` backend take (``resident_weight_bytes``: packed forms included,
    each storage once): equal but for what paper cannot know, the quantized blocks kept
    beside weights whose values allow them (kernels/cpu/linear_blocks.py), and the
    buffers (rotary tables)."""
    from runtime import Engine
    from runtime.capacity import weight_bytes
    from runtime.layers import packed_weights, resident_weight_bytes

    engine = Engine(str(model_dir), dtype="float32", max_total_tokens=2_000)
    try:
        model = engine.worker.model
        packed = packed_weights(model)
        if not packed:
            pytest.skip("no packed weights here (a PyTorch build without oneDNN and no AVX2)")
        blocks = sum(p.few_rows.numel() * 4 for p in packed if p.few_rows is not None)
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        cfg = engine.worker.model_config
        resident = resident_weight_bytes(model)
        assert engine.worker.weight_bytes == resident
        paper = weight_bytes(cfg, "float32", packed_on_cpu=True)
        assert abs(resident - blocks - buffers - paper) <= 0.01 * paper  # oneDNN may pad its layout
        assert paper - weight_bytes(cfg, "float32") == cfg.vocab_size * cfg.hidden_size * 4  # the tied head's copy
    finally:
        engine.shutdown()
