"""What tool calling costs on the chat route: grammar enforcement and call parsing, in one
run against a local server.

    python -m bench_agent.bench_tools            # ~2 min on 2 cores
    python -m bench_agent.bench_tools --quick

A tool loop (8 conversations in flight, each: a user question, a required tool call, the
tool's result, then an auto step) runs with ``tools``; then the same requests run again with
the same tools shown but ``tool_choice: "none"`` (no grammar, no parsing) and each call held
to the tool run's output length (``ignore_eos``), so both compute the same tokens. The
ratio of the two wall times is the cost of tool calling.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer", "maximum": 999},
                                                        "b": {"type": "integer", "maximum": 999}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]
CITIES = ["Paris", "Lima", "Oslo", "Kyoto", "Cairo", "Quito", "Perth", "Bern", "Porto", "Riga", "Lyon", "Nice"]


def _chat(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/v1/chat/completions", json=body)
    resp.raise_for_status()
    return resp.json()


def tool_loop(client: httpx.Client, model: str, city: str, log: list[tuple[dict[str, Any], int]]) -> None:
    """One conversation; records each request with the tokens it generated."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"What is the weather in {city}?"}]
    for choice in ("required", "auto"):
        body = {"model": model, "messages": list(messages), "tools": TOOLS, "tool_choice": choice,
                "temperature": 0, "max_tokens": 48}
        out = _chat(client, body)
        log.append((body, out["usage"]["completion_tokens"]))
        msg = out["choices"][0]["message"]
        if not msg.get("tool_calls"):
            return
        messages.append({"role": "assistant", "content": msg.get("content"), "tool_calls": msg["tool_calls"]})
        for call in msg["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"{args}: 18 degrees"})


def replay_without_tools(client: httpx.Client, body: dict[str, Any], tokens: int) -> None:
    _chat(client, {**body, "tool_choice": "none", "max_tokens": tokens, "ignore_eos": True})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 conversations instead of 12")
    ap.add_argument("--url", help="a running forkserve server (default: start one)")
    ns = ap.parse_args()
    from bench_agent.local_server import ServerProcess

    proc = None if ns.url else ServerProcess().wait_ready()
    url = ns.url or proc.url  # type: ignore[union-attr]
    try:
        client = httpx.Client(base_url=url, timeout=600)
        model = client.get("/v1/models").json()["data"][0]["id"]
        cities = CITIES[:4] if ns.quick else CITIES
        tool_loop(client, model, "Warsaw", [])  # warm up: compile the grammars, fill the cache
        log: list[tuple[dict[str, Any], int]] = []
        client.post("/flush_cache")
        start = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda c: tool_loop(client, model, c, log), cities))
        with_tools = time.perf_counter() - start
        client.post("/flush_cache")
        start = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda item: replay_without_tools(client, *item), log))
        without = time.perf_counter() - start
        tokens = sum(n for _, n in log)
        print(f"{len(log)} calls, {tokens} output tokens: {with_tools:.2f} s with tool calling, "
              f"{without:.2f} s with tool_choice none and the same lengths: {with_tools / without:.3f}x")
    finally:
        if proc is not None:
            proc.stop()


if __name__ == "__main__":
    main()
