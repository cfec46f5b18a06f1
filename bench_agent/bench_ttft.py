"""Time to first token of one agent call with a long new prompt, on forkserve and optionally
another OpenAI-compatible server, one engine at a time.

Each call is what an agent sends when a tool returns a long result: a cached system prompt
(~240 tokens, warmed once) and a new user message of N tokens never seen before, streamed
through the chat API with ``max_tokens`` 1. Per size, ``--repeats`` calls one after another;
the table has the median and the best, and with ``--compare`` the ratio other / forkserve
(above 1: forkserve answers first).

    python -m bench_agent.bench_ttft                                  # forkserve only
    python -m bench_agent.bench_ttft --compare http://127.0.0.1:8001 --compare-cmd "vllm serve ..."
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import statistics
import sys
import time
from collections.abc import Iterator

import httpx
import orjson

from bench_agent.compare import add_compare_args, peer_running
from bench_agent.synth import rng_for, text

SYSTEM_TOKENS = 240


def prompt_of(tokenizer, tokens: int, seed: object) -> str:  # noqa: ANN001
    """Synthetic text of exactly ``tokens`` tokens for ``tokenizer`` (which both servers share)."""
    ids = tokenizer.encode(text(rng_for("ttft", seed), tokens + 50), add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids)


def first_token_seconds(client: httpx.Client, model: str, system: str, user: str) -> float:
    """Seconds from sending one streamed chat call to its first content chunk."""
    body = {"model": model, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": 1, "temperature": 0, "stream": True}
    start = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{client.base_url}: HTTP {resp.status_code}: {resp.read()[:300]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = orjson.loads(line[6:]).get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                return time.perf_counter() - start
    raise RuntimeError(f"{client.base_url}: the stream ended without a token")


def measure(url: str, tokenizer, sizes: list[int], repeats: int, tag: str) -> dict[int, list[float]]:  # noqa: ANN001
    """TTFT of ``repeats`` calls per size; the system prompt is warmed into the cache first."""
    with httpx.Client(base_url=url.rstrip("/").removesuffix("/v1"), timeout=600) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        system = "You are a careful agent. " + prompt_of(tokenizer, SYSTEM_TOKENS, "system")
        first_token_seconds(client, model, system, "Warm up.")
        first_token_seconds(client, model, system, prompt_of(tokenizer, 64, f"{tag}-warm"))
        return {n: [first_token_seconds(client, model, system, prompt_of(tokenizer, n, f"{tag}-{n}-{i}"))
                    for i in range(repeats)] for n in sizes}


@contextlib.contextmanager
def forkserve_url(ns: argparse.Namespace) -> Iterator[str]:
    if ns.url:
        yield ns.url
        return
    from runtime.server.server_process import ServerProcess

    server = ServerProcess(*shlex.split(ns.server_args)).wait_ready()
    try:
        yield server.url
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="A running forkserve server (default: start a local one with --server-args).")
    ap.add_argument("--server-args", default="", help="Flags for the local forkserve server.")
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[600, 2000], help="New prompt tokens per call.")
    ap.add_argument("--repeats", type=int, default=5, help="Calls per size (default: %(default)s).")
    ap.add_argument("--api-key", help=argparse.SUPPRESS)
    add_compare_args(ap)
    ns = ap.parse_args(argv)
    from runtime.model_loader.default_model import resolve_model_path
    from runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer(resolve_model_path(None)).hf
    results = {}
    with forkserve_url(ns) as url:
        results["forkserve"] = measure(url, tokenizer, ns.new_tokens, ns.repeats, "forkserve")
    if ns.compare:
        with peer_running(ns):
            results["other"] = measure(ns.compare, tokenizer, ns.new_tokens, ns.repeats, "other")
    other = ns.compare_label or ns.compare
    head = "| new prompt tokens | forkserve TTFT p50 / best (ms) |"
    head += f" {other} TTFT p50 / best (ms) | {other} / forkserve (p50) |" if ns.compare else ""
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|")
    for n in ns.new_tokens:
        ours = results["forkserve"][n]
        line = f"| {n} | {statistics.median(ours) * 1e3:.0f} / {min(ours) * 1e3:.0f} |"
        if ns.compare:
            theirs = results["other"][n]
            ratio = statistics.median(theirs) / statistics.median(ours)
            line += f" {statistics.median(theirs) * 1e3:.0f} / {min(theirs) * 1e3:.0f} | {ratio:.2f}x |"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
