"""Offline engine throughput against transformers on the same weights, in one run.

    python -m bench_agent.bench_offline            # full run (~10 min on 2 cores)
    python -m bench_agent.bench_offline --quick    # smaller sizes, for a smoke check

Reports ratios measured in the same process, because absolute times on shared machines
drift: forkserve vs transformers' one-request-at-a-time ``generate`` (the raw baseline),
vs its padded batched ``generate``, decode step time at batch 32 vs batch 1 (and the
same ratio for the step's matrix products alone, and for the steps' roofline floors from
this machine's memory bandwidth and multiply-add rate measured in the same run), and
prefill tokens/s vs one plain transformers forward over the same tokens and vs the compute
roofline (the machine's best multiply-add rate: AMX tiles where the CPU has them), and a
prefill chunk's matrix products against oneDNN's bf16 GEMM on the same shapes.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import torch

from bench_agent import roofline
from kernels.cpu.build import CpuKernelsUnavailable


def make_prompts(tokenizer, n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    """Prompts of mixed lengths from seeded random English-like text (no datasets)."""
    rng = random.Random(seed)
    words = ["the", "agent", "reads", "a", "tool", "result", "then", "plans", "its", "next", "step", "and", "writes", "code", "to", "test", "it"]
    prompts = []
    for _ in range(n):
        target = rng.randint(lo, hi)
        ids = tokenizer.encode(" ".join(rng.choice(words) for _ in range(target)))
        prompts.append(ids[:target])
    return prompts


def timed(fn) -> tuple[Any, float]:  # noqa: ANN001
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def bench_engine(engine, prompts: list[list[int]], new_tokens: int) -> float:
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    engine.flush_cache()
    _, secs = timed(lambda: engine.generate(input_ids=prompts, sampling_params=params, progress=True))
    return secs


def bench_hf_one_at_a_time(model, prompts: list[list[int]], new_tokens: int) -> float:
    with torch.inference_mode():
        start = time.perf_counter()
        for ids in prompts:
            model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return time.perf_counter() - start


def bench_hf_padded(model, prompts: list[list[int]], new_tokens: int, batch_size: int) -> float:
    with torch.inference_mode():
        start = time.perf_counter()
        for b in range(0, len(prompts), batch_size):
            chunk = prompts[b : b + batch_size]
            width = max(map(len, chunk))
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.long)
            for i, p in enumerate(chunk):  # left padding, as decoder-only generate wants
                ids[i, width - len(p) :] = torch.tensor(p)
                mask[i, width - len(p) :] = 1
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return time.perf_counter() - start


def decode_step_ms(engine, batch: int, steps: int, prompt_len: int, seed: int) -> float:
    """Time per decode step at ``batch`` running requests (prompts prefilled beforehand)."""
    prompts = make_prompts(engine.tokenizer, batch, prompt_len, prompt_len, seed)
    engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 0})
    params = {"temperature": 0, "max_new_tokens": steps + 1, "ignore_eos": True}
    _, secs = timed(lambda: engine.generate(input_ids=prompts, sampling_params=params))
    return secs / (steps + 1) * 1000


@torch.inference_mode()
def matmul_ms(engine, batch: int, reps: int = 3) -> float:
    """One decode step's matrix products alone at ``batch`` tokens: every linear layer of the
    engine's model (as the worker set them up) and the output head, on random inputs."""
    from runtime.layers.linear import Linear

    model = engine.worker.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    dtype = engine.worker.dtype
    inputs = [torch.randn(batch, m.in_features, dtype=dtype) for m in linears]
    hidden = torch.randn(batch, model.cfg.hidden_size, dtype=dtype)

    def step() -> None:
        for m, x in zip(linears, inputs, strict=True):
            m(x)
        model.compute_logits(hidden)

    step()
    return roofline.best_seconds(step, reps) * 1000


def step_floors_ms(engine, context: int) -> tuple[float, float, roofline.Machine | None]:
    """The roofline floors of a decode step at batch 1 and 32 (see ``bench_agent.roofline``),
    from this machine's rates measured now; NaN on a GPU or a CPU build without the probes."""
    dtype = engine.args.resolved_dtype
    if engine.worker.device != "cpu":
        return float("nan"), float("nan"), None
    try:
        machine = roofline.measure(dtype)
    except (RuntimeError, CpuKernelsUnavailable) as exc:
        print(f"roofline not measured: {exc}")
        return float("nan"), float("nan"), None
    cost = roofline.StepCost.of(engine.worker.model.cfg, dtype)
    return cost.floor_ms(machine, 1, context), cost.floor_ms(machine, 32, context), machine


def prefill_linear_gflop_s(engine, rows: int = 512, reps: int = 5) -> tuple[float, float]:
    """GFLOP/s of one prefill chunk's matrix products (each distinct linear shape of the
    model at ``rows`` rows, as the engine runs them) and of oneDNN's bf16 GEMM (PyTorch's
    packed ``mkldnn`` linear, AMX where the CPU has it) on the same shapes, same run."""
    from kernels.cpu.packed_linear import _onednn_ops, packed_linear
    from runtime.layers import packed_weights

    packed = {(p.in_features, p.out_features): p for p in packed_weights(engine.worker.model)}
    packed.pop((engine.worker.model.cfg.hidden_size, engine.worker.model.cfg.vocab_size), None)  # the head: 1 row

    reorder, onednn = _onednn_ops()
    dtype = engine.worker.dtype
    flops = sum(2 * rows * k * n for k, n in packed)
    inputs = {shape: torch.randn(rows, shape[0], dtype=dtype) for shape in packed}
    theirs_w = {shape: reorder(torch.randn(shape[1], shape[0], dtype=dtype)) for shape in packed}

    def ours() -> None:
        for shape, weight in packed.items():
            packed_linear(inputs[shape], weight)

    def theirs() -> None:
        for shape, weight in theirs_w.items():
            onednn(inputs[shape], weight, None, "none", [], "")

    times = {"ours": float("inf"), "theirs": float("inf")}
    for _ in range(reps):  # interleaved: drift hits both alike
        times["ours"] = min(times["ours"], roofline.best_seconds(ours, 1))
        times["theirs"] = min(times["theirs"], roofline.best_seconds(theirs, 1))
    return flops / times["ours"] / 1e9, flops / times["theirs"] / 1e9


def prefill_tok_s(engine, model, num: int, length: int, seed: int) -> tuple[float, float]:
    prompts = make_prompts(engine.tokenizer, num, length, length, seed)
    prompts = [p for p in prompts if len(p) == length] or prompts
    tokens = sum(map(len, prompts))
    engine.flush_cache()
    _, ours = timed(lambda: engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 0}))
    with torch.inference_mode():
        batch = torch.tensor(prompts)
        model(batch[:1, :8])  # warm-up
        _, theirs = timed(lambda: model(batch, use_cache=False))
    return tokens / ours, tokens / theirs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=64, help="Prompts in the throughput run.")
    ap.add_argument("--min-len", type=int, default=50, help="Shortest prompt, in tokens.")
    ap.add_argument("--max-len", type=int, default=1000, help="Longest prompt, in tokens.")
    ap.add_argument("--new-tokens", type=int, default=128, help="Tokens generated per prompt (EOS ignored).")
    ap.add_argument(
        "--hf-sample",
        type=int,
        default=8,
        help="Prompts timed with one-at-a-time transformers generate; its throughput is tokens/s "
        "over this sample (the full set would take most of an hour).",
    )
    ap.add_argument("--hf-batch-size", type=int, default=16, help="Batch size of padded transformers generate.")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="Dtype for both sides.")
    ap.add_argument("--seed", type=int, default=0, help="Seed for the synthetic prompts.")
    ap.add_argument("--quick", action="store_true", help="Small sizes for a fast smoke run.")
    args = ap.parse_args()
    if args.quick:
        args.num_prompts, args.new_tokens, args.hf_sample, args.max_len = 8, 16, 2, 200

    from transformers import AutoModelForCausalLM

    from runtime.engine import Engine
    from runtime.executor.worker import TORCH_DTYPES

    engine = Engine(dtype=args.dtype, max_total_tokens=200_000, max_running_requests=64)
    dtype_name = engine.args.resolved_dtype
    model = AutoModelForCausalLM.from_pretrained(str(engine.model_dir), dtype=TORCH_DTYPES[dtype_name]).eval()
    prompts = make_prompts(engine.tokenizer, args.num_prompts, args.min_len, args.max_len, args.seed)
    out_tokens = args.num_prompts * args.new_tokens
    engine.generate("warm up", {"max_new_tokens": 2})

    ours = bench_engine(engine, prompts, args.new_tokens)
    sample = prompts[: args.hf_sample]
    hf_one = bench_hf_one_at_a_time(model, sample, args.new_tokens)
    hf_pad = bench_hf_padded(model, prompts, args.new_tokens, args.hf_batch_size)
    ours_tps = out_tokens / ours
    one_tps = len(sample) * args.new_tokens / hf_one
    pad_tps = out_tokens / hf_pad

    steps = 8 if args.quick else 32
    step1 = decode_step_ms(engine, 1, steps, 200, args.seed + 1)
    step32 = decode_step_ms(engine, 32, steps, 200, args.seed + 2)
    mm1, mm32 = matmul_ms(engine, 1), matmul_ms(engine, 32)
    floor1, floor32, machine = step_floors_ms(engine, 200)
    pre_ours, pre_hf = prefill_tok_s(engine, model, 4, 512, args.seed + 3)
    gemm_ours = gemm_onednn = float("nan")
    if engine.worker.device == "cpu" and dtype_name == "bfloat16":
        gemm_ours, gemm_onednn = prefill_linear_gflop_s(engine)
    cfg = engine.worker.model.cfg
    layer_flops_per_token = 2 * (roofline.StepCost.of(cfg, dtype_name).weight_params - cfg.vocab_size * cfg.hidden_size)
    pre_floor = machine.peak_gflop_s * 1e9 / layer_flops_per_token if machine is not None else float("nan")

    rows = [
        ("output tokens/s, forkserve", f"{ours_tps:.1f}", ""),
        ("output tokens/s, transformers one at a time", f"{one_tps:.1f}", f"forkserve = {ours_tps / one_tps:.1f}x (target >= 10x)"),
        (f"output tokens/s, transformers padded batch {args.hf_batch_size}", f"{pad_tps:.1f}", f"forkserve = {ours_tps / pad_tps:.2f}x (target >= 1.5x)"),
        ("decode step, batch 1 (ms)", f"{step1:.1f}", ""),
        ("decode step, batch 32 (ms)", f"{step32:.1f}", f"batch 32 / batch 1 = {step32 / step1:.2f} (target <= 2)"),
        ("its matrix products alone, batch 1 / batch 32 (ms)", f"{mm1:.1f} / {mm32:.1f}", f"batch 32 / batch 1 = {mm32 / mm1:.2f}"),
        ("roofline floor of the step, batch 1 / batch 32 (ms)", f"{floor1:.1f} / {floor32:.1f}",
         f"batch 32 / batch 1 = {floor32 / floor1:.2f}; the steps above take {step1 / floor1:.2f}x / {step32 / floor32:.2f}x their floors"),
        ("prefill tokens/s, forkserve", f"{pre_ours:.0f}",
         f"{pre_ours / pre_floor:.0%} of the compute roofline ({pre_floor:.0f} tokens/s at the peak below)"),
        ("a prefill chunk's matrix products (512 rows), ours / oneDNN's bf16 GEMM (GFLOP/s)",
         f"{gemm_ours:.0f} / {gemm_onednn:.0f}", f"ours = {gemm_ours / max(gemm_ours, gemm_onednn):.0%} of the best "
         f"(target >= 70%); {gemm_ours / machine.peak_gflop_s if machine else float('nan'):.0%} of the peak"),
        ("prefill tokens/s, one transformers forward", f"{pre_hf:.0f}", f"forkserve = {pre_ours / pre_hf:.2f}x (target >= 0.8)"),
    ]
    print(f"\n{args.num_prompts} prompts of {args.min_len}-{args.max_len} tokens x {args.new_tokens} new tokens, "
          f"dtype {dtype_name}, {torch.get_num_threads()} threads")
    if machine is not None:
        print(f"roofline (python -m bench_agent.roofline): read {machine.read_gb_s:.1f} GB/s, {dtype_name} "
              f"multiply-adds {machine.peak_gflop_s:.0f} GFLOP/s ({machine.peak_source}), measured in this run")
    print()
    print("| measurement | value | ratio |\n|---|---|---|")
    for name, value, ratio in rows:
        print(f"| {name} | {value} | {ratio} |")
    engine.shutdown()


if __name__ == "__main__":
    main()
