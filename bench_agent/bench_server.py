"""What the HTTP server costs over the offline engine, measured in one run.

    python -m bench_agent.bench_server            # 64 prompts, ~5 min on 2 cores
    python -m bench_agent.bench_server --quick    # a smoke check

1. Throughput: the same prompts (token ids, fixed output length) through
   ``Engine.generate`` in-process and through ``POST /generate`` with 64 concurrent
   clients; reports the ratio of output tokens/s.
2. Added latency at low load: one request at a time (short prompt, a few tokens), p50 of
   the client's wall time through HTTP minus p50 of ``Engine.generate``'s.

Both sides use the same engine arguments and are loaded side by side; measurements
alternate between them (one runs while the other idles), and medians are compared, so
drift in the machine's speed affects both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
from tqdm import tqdm

from bench_agent.bench_offline import make_prompts
from runtime.server.server_process import ServerProcess


def offline_batch(engine, prompts: list[list[int]], new_tokens: int) -> float:  # noqa: ANN001
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    engine.flush_cache()
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    assert all(o["meta_info"]["completion_tokens"] == new_tokens for o in outs)
    return time.perf_counter() - start


def http_batch(url: str, prompts: list[list[int]], new_tokens: int, concurrency: int) -> float:
    httpx.post(url + "/flush_cache", timeout=60).raise_for_status()
    return asyncio.run(_http_batch(url, prompts, new_tokens, concurrency))


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 prompts, 32 new tokens, 10 latency probes")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--reps", type=int, default=30, help="latency probes per side")
    ap.add_argument("--rounds", type=int, default=3, help="throughput runs per side, alternating")
    ns = ap.parse_args()
    if ns.quick:
        ns.num_prompts, ns.new_tokens, ns.reps, ns.rounds = 16, 32, 10, 2

    from runtime.model_loader import resolve_model_path
    from runtime.tokenizer import Tokenizer

    tok = Tokenizer(resolve_model_path(None))
    prompts = make_prompts(tok, ns.num_prompts, 50, 500, seed=0)
    probe, probe_tokens = tok.encode("Reply with one word: ready?"), 4
    engine_args = {"dtype": ns.dtype, "max_running_requests": max(64, ns.concurrency)}
    cli = ["--dtype", ns.dtype, "--max-running-requests", str(engine_args["max_running_requests"])]

    from runtime.engine import Engine

    engine = Engine(**engine_args)
    server = ServerProcess(*cli).wait_ready()
    probe_params = {"temperature": 0, "max_new_tokens": probe_tokens, "ignore_eos": True}
    off_times, http_times, off_lat, http_lat = [], [], [], []
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:

            def http_probe() -> float:
                t = time.perf_counter()
                client.post("/generate", json={"input_ids": probe, "sampling_params": probe_params}).raise_for_status()
                return time.perf_counter() - t

            def offline_probe() -> float:
                t = time.perf_counter()
                engine.generate(input_ids=probe, sampling_params=probe_params)
                return time.perf_counter() - t

            offline_batch(engine, prompts[:4], 2)  # warm-up both sides
            http_batch(server.url, prompts[:4], 2, ns.concurrency)
            # Alternate the two sides so drift in machine speed hits both alike.
            for _ in tqdm(range(ns.rounds), desc="throughput rounds"):
                off_times.append(offline_batch(engine, prompts, ns.new_tokens))
                http_times.append(http_batch(server.url, prompts, ns.new_tokens, ns.concurrency))
            for _ in tqdm(range(ns.reps), desc="latency probes"):
                off_lat.append(offline_probe())
                http_lat.append(http_probe())
    finally:
        server.stop()
        engine.shutdown()
    off_secs, http_secs = statistics.median(off_times), statistics.median(http_times)

    out_tokens = ns.num_prompts * ns.new_tokens
    off_p50, http_p50 = statistics.median(off_lat) * 1e3, statistics.median(http_lat) * 1e3
    print(f"\nmedians of {ns.rounds} alternating rounds; {ns.num_prompts} prompts of 50-500 tokens x {ns.new_tokens} new tokens, dtype {ns.dtype}")
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
