"""What the HTTP server costs over the offline engine, measured in one run.

    python -m bench_agent.bench_server            # 64 prompts, ~5 min on 2 cores
    python -m bench_agent.bench_server --quick    # a smoke check

1. Throughput: the same prompts (token ids, fixed output length) through
   ``Engine.generate`` in-process and through ``POST /generate`` with 64 concurrent
   clients; reports the ratio of output tokens/s.
2. Added latency at low load: one request at a time (short prompt, a few tokens), p50 of
   the client's wall time through HTTP minus p50 of ``Engine.generate``'s.

Both sides use the same engine arguments; the server runs while the in-process engine is
idle, so they do not compete for cores.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time

import httpx

from bench_agent.bench_offline import make_prompts
from bench_agent.local_server import ServerProcess


def run_offline(engine_args: dict, prompts: list[list[int]], new_tokens: int, probe: list[int], probe_tokens: int, reps: int) -> tuple[float, list[float]]:
    from runtime.engine import Engine

    engine = Engine(**engine_args)
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    engine.generate(input_ids=prompts[:2], sampling_params={**params, "max_new_tokens": 2})  # warm-up
    engine.flush_cache()
    start = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params, progress=True)
    secs = time.perf_counter() - start
    lat = []
    probe_params = {"temperature": 0, "max_new_tokens": probe_tokens, "ignore_eos": True}
    for _ in range(reps):
        t = time.perf_counter()
        engine.generate(input_ids=probe, sampling_params=probe_params)
        lat.append(time.perf_counter() - t)
    engine.shutdown()
    del engine
    gc.collect()
    return secs, lat


async def _http_batch(url: str, prompts: list[list[int]], new_tokens: int, concurrency: int) -> float:
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:

        async def one(ids: list[int]) -> None:
            async with sem:
                resp = await client.post("/generate", json={"input_ids": ids, "sampling_params": params})
                resp.raise_for_status()
                assert resp.json()["meta_info"]["completion_tokens"] == new_tokens

        start = time.perf_counter()
        await asyncio.gather(*(one(p) for p in prompts))
        return time.perf_counter() - start


def run_http(cli_args: list[str], prompts: list[list[int]], new_tokens: int, probe: list[int], probe_tokens: int, reps: int, concurrency: int) -> tuple[float, list[float]]:
    server = ServerProcess(*cli_args).wait_ready()
    try:
        params = {"temperature": 0, "max_new_tokens": 2, "ignore_eos": True}
        httpx.post(server.url + "/generate", json={"input_ids": prompts[:2], "sampling_params": params}, timeout=600)
        httpx.post(server.url + "/flush_cache", timeout=60)
        secs = asyncio.run(_http_batch(server.url, prompts, new_tokens, concurrency))
        lat = []
        probe_params = {"temperature": 0, "max_new_tokens": probe_tokens, "ignore_eos": True}
        with httpx.Client(base_url=server.url, timeout=600) as client:
            for _ in range(reps):
                t = time.perf_counter()
                client.post("/generate", json={"input_ids": probe, "sampling_params": probe_params}).raise_for_status()
                lat.append(time.perf_counter() - t)
        return secs, lat
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 prompts, 32 new tokens, 10 latency probes")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--reps", type=int, default=30, help="latency probes per side")
    ns = ap.parse_args()
    if ns.quick:
        ns.num_prompts, ns.new_tokens, ns.reps = 16, 32, 10

    from runtime.model_loader import resolve_model_path
    from runtime.tokenizer import Tokenizer

    tok = Tokenizer(resolve_model_path(None))
    prompts = make_prompts(tok, ns.num_prompts, 50, 500, seed=0)
    probe, probe_tokens = tok.encode("Reply with one word: ready?"), 4
    engine_args = {"dtype": ns.dtype, "max_running_requests": max(64, ns.concurrency)}
    cli = ["--dtype", ns.dtype, "--max-running-requests", str(engine_args["max_running_requests"])]

    off_secs, off_lat = run_offline(engine_args, prompts, ns.new_tokens, probe, probe_tokens, ns.reps)
    http_secs, http_lat = run_http(cli, prompts, ns.new_tokens, probe, probe_tokens, ns.reps, ns.concurrency)

    out_tokens = ns.num_prompts * ns.new_tokens
    off_p50, http_p50 = statistics.median(off_lat) * 1e3, statistics.median(http_lat) * 1e3
    print(f"\n{ns.num_prompts} prompts of 50-500 tokens x {ns.new_tokens} new tokens, dtype {ns.dtype}")
    print("| measurement | offline Engine | HTTP server | ratio / difference |")
    print("|---|---|---|---|")
    print(
        f"| output tok/s, {ns.concurrency} concurrent | {out_tokens / off_secs:.1f} | {out_tokens / http_secs:.1f} "
        f"| {off_secs / http_secs:.3f} (target >= 0.9) |"
    )
    print(
        f"| p50 latency, 1 request at a time ({probe_tokens} tokens) | {off_p50:.1f} ms | {http_p50:.1f} ms "
        f"| +{http_p50 - off_p50:.1f} ms (target <= 5 ms) |"
    )


if __name__ == "__main__":
    main()
