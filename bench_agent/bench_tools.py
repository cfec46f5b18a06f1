"""What tool calling costs on the chat route: the tool prompt, grammar enforcement and call
parsing, against the same chat without tools, with jump-forward on (the default) and off.

    python -m bench_agent.bench_tools                     # 12 conversations, ~5 min on 2 cores
    python -m bench_agent.bench_tools --conversations 4   # smaller

Two local servers run side by side (one with ``--no-enable-jump-forward``); each is measured
while the other idles. On each, a tool loop (8 conversations in flight, each: a user
question, a ``required`` tool call, the tool's result, an ``auto`` step) runs with
``tools``; then the same calls run again without ``tools`` / ``tool_choice``: the same
messages (the tool results included), each call held to the length its tool run generated
(``max_tokens`` and ``ignore_eos``), conversations in flight the same way. The cache is
flushed before each side. The ratio of the two wall times is the cost of tool calling on
that server.
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
IN_FLIGHT = 8
# Room for a whole call also without jump-forward, where the model writes the call's markup
# itself, token by token, often in more tokens than its canonical tokenization.
MAX_TOKENS = 96

# A call: (its request body, the tokens it generated)
Call = tuple[dict[str, Any], int]


def _chat(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/v1/chat/completions", json=body)
    resp.raise_for_status()
    return resp.json()


def tool_loop(client: httpx.Client, model: str, city: str) -> list[Call]:
    """One conversation with tools; its calls, each with the tokens it generated."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"What is the weather in {city}?"}]
    calls: list[Call] = []
    for choice in ("required", "auto"):
        body = {"model": model, "messages": list(messages), "tools": TOOLS, "tool_choice": choice,
                "temperature": 0, "max_tokens": MAX_TOKENS}
        out = _chat(client, body)
        calls.append((body, out["usage"]["completion_tokens"]))
        msg = out["choices"][0]["message"]
        if not msg.get("tool_calls") or out["choices"][0]["finish_reason"] == "length":
            break  # answered, or a call cut by max_tokens (its arguments are not whole JSON)
        messages.append({"role": "assistant", "content": msg.get("content"), "tool_calls": msg["tool_calls"]})
        for call in msg["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"{args}: 18 degrees"})
    return calls


def without_tools(body: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The same call as a plain chat: same messages, no tools, the tool run's output length."""
    plain = {k: v for k, v in body.items() if k not in ("tools", "tool_choice", "parallel_tool_calls")}
    return {**plain, "max_tokens": tokens, "ignore_eos": True}


def replay_without_tools(client: httpx.Client, calls: list[Call]) -> int:
    """One conversation's calls again, in order, without tools; the tokens generated."""
    return sum(_chat(client, without_tools(body, tokens))["usage"]["completion_tokens"] for body, tokens in calls)


def measure(url: str, cities: list[str], warm_up: bool = True) -> dict[str, Any]:
    """Tool loops, then the same calls without tools, on the server at ``url``; with
    ``warm_up``, one loop and its replay first, untimed (grammars compiled, code paths run)."""
    client = httpx.Client(base_url=url, timeout=600)
    model = client.get("/v1/models").json()["data"][0]["id"]
    if warm_up:
        replay_without_tools(client, tool_loop(client, model, "Warsaw"))
    client.post("/flush_cache")
    start = time.perf_counter()
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        conversations = list(pool.map(lambda c: tool_loop(client, model, c), cities))
    with_tools = time.perf_counter() - start
    client.post("/flush_cache")
    start = time.perf_counter()
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        replayed = sum(pool.map(lambda calls: replay_without_tools(client, calls), conversations))
    plain = time.perf_counter() - start
    tokens = sum(n for calls in conversations for _, n in calls)
    if replayed != tokens:
        raise RuntimeError(f"the calls without tools generated {replayed} tokens, the tool calls {tokens}")
    return {"calls": sum(len(c) for c in conversations), "tokens": tokens, "with_tools_s": with_tools,
            "without_tools_s": plain, "ratio": with_tools / plain, "conversations": conversations}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=len(CITIES), help="tool loops per side (at most 12)")
    ap.add_argument("--server-args", default="", help="extra flags for both local servers")
    ns = ap.parse_args(argv)
    if not 1 <= ns.conversations <= len(CITIES):
        ap.error(f"--conversations must be in [1, {len(CITIES)}]")
    import shlex

    from runtime.server.server_process import ServerProcess

    flags = shlex.split(ns.server_args)
    sides = {"jump-forward on": ServerProcess(*flags), "jump-forward off": ServerProcess(*flags, "--no-enable-jump-forward")}
    try:
        for proc in sides.values():
            proc.wait_ready()
        for label, proc in sides.items():
            r = measure(proc.url, CITIES[: ns.conversations])
            print(f"{label}: {r['calls']} calls, {r['tokens']} output tokens: {r['with_tools_s']:.2f} s with tools, "
                  f"{r['without_tools_s']:.2f} s for the same calls without tools: {r['ratio']:.3f}x")
    finally:
        for proc in sides.values():
            proc.stop()


if __name__ == "__main__":
    main()
