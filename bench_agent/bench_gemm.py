"""The model's linear layers as a step runs them, each packed form of one dtype that this
machine can use against the others, alternating in one process (so that the machine's
drift hits all alike):

    python -m bench_agent.bench_gemm
    python -m bench_agent.bench_gemm --dtype float32 --rows 1 8 17 64 512 --rounds 9
    python -m bench_agent.bench_gemm --output-layer --rows 1 4 8 12

Each case multiplies ``--rows`` input rows by every layer's four products (the fused
q/k/v, o, the fused gate/up and down projections of the default model's shapes, random
weights), layer after layer, so that, as in a decode step, the weights come from memory
rather than cache. For float32 the weights are 4-bit affine blocks, as the default model's
are, and ``q4_blocks`` multiplies them from those blocks (``linear_blocks.cpp``) at every row
count (the layers take it only for a few rows). ``--output-layer`` multiplies the default
model's output layer instead (49,152 x 576, 113 MB in float32, its weights 8-bit scaled
blocks as the model's are, ``q8_blocks``: ``linear_blocks.cpp``). The table gives GFLOP/s (best
round) and each form's time against the first form's (median over rounds; above 1: slower).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def four_bit_blocks(out_features: int, in_features: int) -> Any:
    """A random float32 weight whose rows are blocks of 32 values d * q + m (q in 0..15, d a
    float16 value), as a GGUF Q4_1 tensor dequantizes to."""
    import torch

    blocks = in_features // 32
    d = (torch.rand(out_features, blocks, 1) * 0.01 + 0.001).half().float()
    m = -8 * d + torch.randn(out_features, blocks, 1) * 1e-3
    q = torch.randint(0, 16, (out_features, blocks, 32)).float()
    q[..., 0], q[..., 1] = 0, 15  # each block's smallest and largest step, as a quantizer's
    return (d * q + m).reshape(out_features, in_features)


def eight_bit_blocks(out_features: int, in_features: int) -> Any:
    """A random float32 weight whose rows are blocks of 32 values d * q (q in -127..127, d a
    float16 value, the largest magnitude 127 steps), as a GGUF Q8_0 tensor dequantizes to."""
    import torch

    d = (torch.rand(out_features, in_features // 32, 1) * 1e-3 + 1e-4).half().float()
    q = torch.randint(-127, 128, (out_features, in_features // 32, 32)).float()
    q[..., 0] = 127
    return (d * q).reshape(out_features, in_features)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="(default: %(default)s)")
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 4, 8, 17, 32, 64, 512], help="input rows per product")
    ap.add_argument("--layers", type=int, default=30, help="layers of weights (default: %(default)s, the model's)")
    ap.add_argument("--rounds", type=int, default=7, help="runs per form and row count (default: %(default)s)")
    ap.add_argument("--output-layer", action="store_true",
                    help="the output layer's product (8-bit blocks in float32) instead of the layers'")
    ns = ap.parse_args(argv)

    import torch

    from kernels.cpu import linear_bf16, linear_blocks, linear_f32
    from kernels.cpu import packed_linear as pl

    dtype = getattr(torch, ns.dtype)
    hidden, heads, kv_heads, head_dim, inter = 576, 9, 3, 64, 1536  # SmolLM2-135M
    shapes = [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim), (2 * inter, hidden),
              (hidden, inter)]
    blocks, make = ("q4_blocks", four_bit_blocks) if not ns.output_layer else ("q8_blocks", eight_bit_blocks)
    kernel = linear_blocks.Q8_0 if ns.output_layer else linear_blocks.Q4_1
    if ns.output_layer:
        shapes, ns.layers = [(49_152, hidden)], 1
    packers = {}
    if dtype == torch.float32 and linear_f32.available():
        packers["f32_panels"] = linear_f32.pack
        packers[blocks] = kernel.pack  # the weights are quantized blocks, as the model's
    if dtype == torch.bfloat16 and linear_bf16.available():
        packers["bf16_panels"] = linear_bf16.pack
    try:
        pl._onednn_can_pack(dtype)
        packers["onednn"] = pl._onednn_ops()[0]
    except pl.PackedLinearUnavailable as err:
        print(err)
    if len(packers) < 2:
        print(f"only {list(packers)} can multiply {ns.dtype} here: nothing to compare")
        return 1
    weights = {kind: [] for kind in packers}
    for _ in range(ns.layers):
        for out_features, in_features in shapes:
            w = make(out_features, in_features) if blocks in packers else torch.randn(
                out_features, in_features).to(dtype)
            for kind, pack in packers.items():
                weights[kind].append(pl.PackedWeight(pack(w), out_features, in_features, dtype, kind))

    kinds = list(packers)
    print("| rows | " + " | ".join(f"{k} GFLOP/s" for k in kinds) + " | " + " | ".join(
        f"{k} time / {kinds[0]}" for k in kinds[1:]) + " |")
    print("|---" * (2 * len(kinds)) + "|")
    for rows in ns.rows:
        inputs = {k: torch.randn(rows, k).to(dtype) for k in {s[1] for s in shapes}}
        times = {k: [] for k in kinds}
        for _ in range(ns.rounds):
            for kind in kinds:
                start = time.perf_counter()
                for w in weights[kind]:
                    if kind == blocks:  # every row count on this kernel
                        kernel.linear(inputs[w.in_features], w.data, w.out_features)
                    else:
                        pl.packed_linear(inputs[w.in_features], w)
                times[kind].append(time.perf_counter() - start)
        flops = 2 * rows * ns.layers * sum(o * i for o, i in shapes)
        ratios = [statistics.median(t / b for t, b in zip(times[k], times[kinds[0]], strict=True)) for k in kinds[1:]]
        print(f"| {rows} | " + " | ".join(f"{flops / min(times[k]) / 1e9:.0f}" for k in kinds) + " | "
              + " | ".join(f"{r:.2f}x" for r in ratios) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
