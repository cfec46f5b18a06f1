"""Interactive calls while a batch job runs, on forkserve and optionally another
OpenAI-compatible server, one engine at a time.

A client sends one ``/v1/completions`` call with ``--batch`` prompts (an offline job: every
prompt decodes ``--batch-tokens`` tokens); while it runs, an agent sends ``--calls`` short
streamed chat calls, one every ``--interval`` seconds. The table has the calls' time to
first token (median and worst) and how long the batch took. A server that queues a call
behind every prompt of the batch answers it only when the batch is nearly done.

    python -m bench_agent.bench_fairness
    python -m bench_agent.bench_fairness --compare http://127.0.0.1:8001 --compare-cmd "vllm serve ..."
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import httpx

from bench_agent.bench_ttft import first_token_seconds, forkserve_url
from bench_agent.compare import add_compare_args, peer_running


def measure(url: str, ns: argparse.Namespace) -> dict[str, object]:
    """The calls' TTFTs (seconds) and the batch's duration on the server at ``url``."""
    base = url.rstrip("/").removesuffix("/v1")
    with httpx.Client(base_url=base, timeout=3600) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        first_token_seconds(client, model, "You are terse.", "Warm up.")
        prompts = [f"Write a short poem about the number {i}." for i in range(ns.batch)]
        body = {"model": model, "prompt": prompts, "max_tokens": ns.batch_tokens, "temperature": 0, "ignore_eos": True}
        batch: dict[str, object] = {}

        def run_batch() -> None:
            start = time.perf_counter()
            try:
                resp = client.post("/v1/completions", json=body)
                batch["error"] = None if resp.status_code == 200 else f"HTTP {resp.status_code}: {resp.text[:300]}"
            finally:
                batch["seconds"] = time.perf_counter() - start

        runner = threading.Thread(target=run_batch)
        runner.start()
        time.sleep(ns.interval)
        ttfts = []
        for i in range(ns.calls):
            if not runner.is_alive():
                break
            ttfts.append(first_token_seconds(client, model, "You are terse.", f"Say hello to user {i}."))
            time.sleep(ns.interval)
        runner.join()
        if batch.get("error"):
            raise RuntimeError(f"{base}: the batch failed: {batch['error']}")
        if not ttfts:
            raise RuntimeError(f"{base}: the batch ended before the first call; raise --batch")
        return {"ttfts": ttfts, "batch_s": batch["seconds"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="A running forkserve server (default: start a local one with --server-args).")
    ap.add_argument("--server-args", default="", help="Flags for the local forkserve server.")
    ap.add_argument("--batch", type=int, default=1000, help="Prompts in the batch call (default: %(default)s; vLLM takes at most 1024).")
    ap.add_argument("--batch-tokens", type=int, default=32, help="Tokens each prompt of the batch decodes "
                    "(default: %(default)s).")
    ap.add_argument("--calls", type=int, default=5, help="Interactive calls sent while the batch runs "
                    "(default: %(default)s).")
    ap.add_argument("--interval", type=float, default=1.0, help="Seconds between the batch's start and the first "
                    "call, and between calls (default: %(default)s).")
    ap.add_argument("--api-key", help=argparse.SUPPRESS)
    add_compare_args(ap)
    ns = ap.parse_args(argv)
    results = {}
    with forkserve_url(ns) as url:
        results["forkserve"] = measure(url, ns)
    if ns.compare:
        with peer_running(ns):
            results[ns.compare_label or ns.compare] = measure(ns.compare, ns)
    print(f"| server | call TTFT p50 (ms) | call TTFT worst (ms) | calls | batch of {ns.batch} (s) |")
    print("|---|---|---|---|---|")
    for name, res in results.items():
        ttfts = res["ttfts"]
        print(f"| {name} | {statistics.median(ttfts) * 1e3:.0f} | {max(ttfts) * 1e3:.0f} | {len(ttfts)} "
              f"| {res['batch_s']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
