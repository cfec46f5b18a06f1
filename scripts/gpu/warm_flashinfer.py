"""Compile FlashInfer's kernels for the shapes the GPU check uses, ahead of the tests.

FlashInfer builds each kernel family (per dtype and head size) with nvcc the first time a
wrapper is planned and run, which takes minutes. Running one small extend-with-prefix and
one decode through ``FlashInferBackend`` per head size, one process per head size, compiles
them in parallel while the script does other work; later processes load the cached builds.

Usage: python scripts/gpu/warm_flashinfer.py HEAD_DIM GQA_RATIO [GQA_RATIO ...]
"""

from __future__ import annotations

import sys
import time

import torch

from tests.test_attention_backends import _run


def main() -> None:
    head_dim, ratios = int(sys.argv[1]), [int(r) for r in sys.argv[2:]]
    for ratio in ratios:
        start = time.perf_counter()
        kv_heads = 2
        shape = (ratio * kv_heads, kv_heads, head_dim)
        _run("flashinfer", [40, 0], [9, 3], *shape, device="cuda", dtype=torch.bfloat16)  # ragged + paged + merge
        _run("flashinfer", [40, 7], [1, 1], *shape, decode=True, device="cuda", dtype=torch.bfloat16)
        print(f"flashinfer head_dim={head_dim} gqa={ratio}: built and checked in {time.perf_counter() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
