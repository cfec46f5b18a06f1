"""GPU throughput of the engine per attention backend, with and without CUDA graphs, against
transformers on the same GPU and weights.

Figures:
  - decode tokens/s at batch 1, 32 and 128: prompts of ``PROMPT_LEN`` random tokens, greedy,
    ``ignore_eos``; the decode time is (time for 1 + N new tokens) - (time for 1), so prefill
    and the first sampling step cancel out;
  - prefill tokens/s: ``PREFILL_BATCH`` prompts of ``PREFILL_LEN`` tokens, one new token;
  - the fraction of the GPU's memory bandwidth that batch-1 decode reaches: bytes a step
    must read (all weights once, the tied embedding as the LM head, plus the K/V of the
    sequence) times steps per second, over ``--peak-bandwidth`` (H200: about 4.3 TB/s);
  - the first backend twice more with graphs: with the argmax taken on the host (the whole
    ``[batch, vocab]`` logits copied back each step) instead of the device argmax that plain
    greedy steps use, and with RMSNorm, rotary and SiLU-and-mul as PyTorch ops instead of
    the fused Triton kernels (``--disable-fused-elementwise``);
  - where a batch-1 graph decode step goes: ``decode_profile.txt`` holds the device time of
    its kernels (torch.profiler) against the wall time, and the host functions that take
    the most time (cProfile).

The prefix cache is off and every run draws fresh prompts, so nothing is reused between
runs. Writes ``bench_gpu.json`` and ``bench_gpu.md`` into ``--out``. ``--quick`` measures
only each backend with graphs (no variants, profile, transformers or bandwidth): enough to
compare the attention backends on another model shape.

Usage: python -m bench_agent.bench_gpu --model-dir DIR --out DIR [--backends flashinfer triton] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PROMPT_LEN = 128
DECODE_TOKENS = 64
DECODE_BATCHES = (1, 32, 128)
PREFILL_BATCH, PREFILL_LEN = 16, 1024
VOCAB_LOW, VOCAB_HIGH = 1000, 40000  # ordinary tokens of the SmolLM2 vocabulary


class Prompts:
    """Fresh random prompts on every call, so no run reuses another's cache."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def __call__(self, batch: int, length: int) -> list[list[int]]:
        return [[self.rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(length)] for _ in range(batch)]


def _timed(fn: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _decode_rate(generate: Callable[[list[list[int]], int], Any], prompts: Prompts, batch: int) -> dict[str, float]:
    t_first = _timed(lambda: generate(prompts(batch, PROMPT_LEN), 1))
    t_all = _timed(lambda: generate(prompts(batch, PROMPT_LEN), 1 + DECODE_TOKENS))
    decode_s = max(t_all - t_first, 1e-9)
    return {"tokens_per_s": batch * DECODE_TOKENS / decode_s, "step_ms": 1000 * decode_s / DECODE_TOKENS}


def _engine(
    model_dir: Path, backend: str, graphs: bool, fused: bool = True
) -> tuple[Any, Callable[[list[list[int]], int], Any]]:
    from runtime.engine import Engine

    engine = Engine(
        str(model_dir), device="cuda", dtype="bfloat16", attention_backend=backend, disable_cuda_graph=not graphs,
        disable_radix_cache=True, max_running_requests=max(DECODE_BATCHES), cuda_graph_max_bs=max(DECODE_BATCHES),
        chunked_prefill_size=8192, max_total_tokens=65536, disable_fused_elementwise=not fused,
    )

    def generate(ids: list[list[int]], new_tokens: int) -> Any:
        params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
        return engine.generate(input_ids=ids, sampling_params=params)

    return engine, generate


def bench_engine(
    model_dir: Path, backend: str, graphs: bool, prompts: Prompts, device_argmax: bool = True, fused: bool = True
) -> dict[str, Any]:
    engine, generate = _engine(model_dir, backend, graphs, fused)
    engine.worker.greedy_on_device = device_argmax
    try:
        generate(prompts(4, 32), 8)  # warm-up: allocator, kernels, plans
        result: dict[str, Any] = {
            "backend": backend, "cuda_graphs": graphs and engine.worker.graph_runner is not None,
            "device_argmax": device_argmax, "fused_elementwise": fused,
        }
        for batch in DECODE_BATCHES:
            result[f"decode_bs{batch}"] = _decode_rate(generate, prompts, batch)
        seconds = _timed(lambda: generate(prompts(PREFILL_BATCH, PREFILL_LEN), 1))
        result["prefill_tokens_per_s"] = PREFILL_BATCH * PREFILL_LEN / seconds
        return result
    finally:
        engine.shutdown()


def profile_decode(model_dir: Path, backend: str, prompts: Prompts, out: Path) -> None:
    """Writes ``decode_profile.txt``: one batch-1 greedy generation of 1 + DECODE_TOKENS
    tokens with graphs on, first under torch.profiler (device time of the kernels against
    the wall time), then under cProfile (host functions by their own time)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    lines = [f"batch-1 greedy decode, {backend}, graphs on, {PROMPT_LEN}-token prompt, 1 + {DECODE_TOKENS} tokens", ""]
    engine = None
    try:
        engine, generate = _engine(model_dir, backend, graphs=True)
        generate(prompts(4, 32), 8)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            wall = _timed(lambda: generate(prompts(1, PROMPT_LEN), 1 + DECODE_TOKENS))
        averages = prof.key_averages()
        device_us = sum(getattr(e, "self_device_time_total", 0) for e in averages)
        lines += [
            f"wall {wall * 1e3:.1f} ms; device time of all kernels {device_us / 1e3:.1f} ms "
            f"({100 * device_us / 1e3 / (wall * 1e3):.0f}% of the wall time)",
            "",
            averages.table(sort_by="self_device_time_total", row_limit=20),
            "",
            averages.table(sort_by="self_cpu_time_total", row_limit=20),
        ]
        profiler = cProfile.Profile()
        profiler.enable()
        generate(prompts(1, PROMPT_LEN), 1 + DECODE_TOKENS)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        lines += ["cProfile, by own time:", text.getvalue()]
    except Exception as exc:  # noqa: BLE001 - the profile is a diagnostic; the figures stand without it
        lines.append(f"profile failed: {type(exc).__name__}: {exc}")
    finally:
        if engine is not None:
            engine.shutdown()
        (out / "decode_profile.txt").write_text("\n".join(lines) + "\n")


def bench_transformers(model_dir: Path, prompts: Prompts) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()

    @torch.inference_mode()
    def generate(ids: list[list[int]], new_tokens: int) -> Any:
        batch = torch.tensor(ids, device="cuda")
        return model.generate(
            batch, attention_mask=torch.ones_like(batch), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=False, pad_token_id=0,
        )

    generate(prompts(4, 32), 8)
    result: dict[str, Any] = {"backend": "transformers", "cuda_graphs": False}
    for batch in DECODE_BATCHES:
        result[f"decode_bs{batch}"] = _decode_rate(generate, prompts, batch)
    ids = torch.tensor(prompts(PREFILL_BATCH, PREFILL_LEN), device="cuda")
    with torch.inference_mode():
        seconds = _timed(lambda: model(ids, logits_to_keep=1))
    result["prefill_tokens_per_s"] = PREFILL_BATCH * PREFILL_LEN / seconds
    return result


def decode_bytes_per_step(model_dir: Path, seq_len: int) -> int:
    """Bytes one batch-1 decode step must read in bfloat16: every weight once (the tied
    embedding once, as the LM head) and the K/V of ``seq_len`` tokens."""
    from runtime.model_loader.weights import iter_safetensors, load_hf_config
    from runtime.models.config import ModelConfig

    cfg = ModelConfig.from_hf(load_hf_config(model_dir))
    weights = sum(t.numel() for _, t in iter_safetensors(model_dir)) * 2
    kv = seq_len * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2
    return weights + kv


def to_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"GPU benchmark, {report['date']} — {report['gpu']}, torch {report['torch']}, triton {report['triton']}, "
        f"flashinfer {report['flashinfer']}",
        f"model: {report['model']}",
        "",
        "| engine | CUDA graphs | greedy argmax | norms, rotary, SiLU | decode bs=1 tok/s (ms/step) "
        "| bs=32 tok/s (ms/step) | bs=128 tok/s (ms/step) | prefill tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        ours = r["backend"] != "transformers"
        argmax = "device" if ours and r.get("device_argmax", True) else "host"
        fused = "fused Triton" if ours and r.get("fused_elementwise", True) else "PyTorch ops"
        head = f"| {r['backend']} | {r['cuda_graphs']} | {argmax} | {fused} |"
        if "error" in r:
            lines.append(f"{head} failed: {r['error']} | | | |")
            continue
        cells = [f"{r[f'decode_bs{b}']['tokens_per_s']:.0f} ({r[f'decode_bs{b}']['step_ms']:.2f})" for b in DECODE_BATCHES]
        lines.append(f"{head} {' | '.join(cells)} | {r['prefill_tokens_per_s']:.0f} |")
    bw = report.get("bandwidth")
    if bw:
        lines += [
            "",
            f"Batch-1 decode ({bw['engine']}): {bw['bytes_per_step'] / 1e6:.1f} MB read per step, "
            f"{bw['achieved_tb_s']:.2f} TB/s = {100 * bw['fraction_of_peak']:.1f}% of {bw['peak_tb_s']} TB/s.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="GPU decode/prefill throughput per attention backend")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backends", nargs="+", default=["flashinfer", "triton"])
    parser.add_argument("--peak-bandwidth", type=float, default=4.3, help="TB/s (H200: about 4.3)")
    parser.add_argument("--quick", action="store_true", help="only each backend with CUDA graphs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = Prompts()
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "flashinfer": _version("flashinfer"),
        "model": str(args.model_dir) + (" (random-weight stand-in)" if (args.model_dir / "STANDIN.txt").exists() else ""),
        "settings": {"prompt_len": PROMPT_LEN, "decode_tokens": DECODE_TOKENS, "prefill": [PREFILL_BATCH, PREFILL_LEN]},
        "runs": [],
    }
    # (backend, CUDA graphs, device argmax, fused elementwise kernels)
    first = args.backends[0]
    if args.quick:
        plan = [(b, True, True, True) for b in args.backends]
    else:
        plan = [(b, g, True, True) for b in args.backends for g in (True, False)]
        plan += [(first, True, False, True), (first, True, True, False), ("torch_native", False, True, True)]
    for backend, graphs, device_argmax, fused in plan:
        print(f"benchmarking {backend} graphs={graphs} device_argmax={device_argmax} fused={fused}", flush=True)
        try:
            report["runs"].append(bench_engine(args.model_dir, backend, graphs, prompts, device_argmax, fused))
        except Exception as exc:  # noqa: BLE001 - one failed backend must not hide the others
            report["runs"].append({
                "backend": backend, "cuda_graphs": graphs, "device_argmax": device_argmax,
                "fused_elementwise": fused, "error": f"{type(exc).__name__}: {exc}",
            })
        _write(args.out, report)
    if args.quick:
        print(to_markdown(report))
        return
    print(f"profiling batch-1 decode on {first}", flush=True)
    profile_decode(args.model_dir, first, prompts, args.out)
    print("benchmarking transformers", flush=True)
    try:
        report["runs"].append(bench_transformers(args.model_dir, prompts))
    except Exception as exc:  # noqa: BLE001
        report["runs"].append({"backend": "transformers", "cuda_graphs": False, "error": f"{type(exc).__name__}: {exc}"})
    best = max(
        (r for r in report["runs"] if "error" not in r and r["backend"] != "transformers"),
        key=lambda r: r["decode_bs1"]["tokens_per_s"],
        default=None,
    )
    if best is not None:
        per_step = decode_bytes_per_step(args.model_dir, PROMPT_LEN + DECODE_TOKENS // 2)
        achieved = per_step * best["decode_bs1"]["tokens_per_s"] / 1e12
        report["bandwidth"] = {
            "engine": f"{best['backend']}, graphs={best['cuda_graphs']}",
            "bytes_per_step": per_step,
            "achieved_tb_s": achieved,
            "peak_tb_s": args.peak_bandwidth,
            "fraction_of_peak": achieved / args.peak_bandwidth,
        }
    _write(args.out, report)
    print(to_markdown(report))


def _version(package: str) -> str:
    if importlib.util.find_spec(package) is None:
        return "not installed"
    return getattr(importlib.import_module(package), "__version__", "?")


def _write(out: Path, report: dict[str, Any]) -> None:
    (out / "bench_gpu.json").write_text(json.dumps(report, indent=2))
    (out / "bench_gpu.md").write_text(to_markdown(report))


if __name__ == "__main__":
    main()
