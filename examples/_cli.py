"""The command line every example shares: in-process engine by default, or a server (its
native API, or with --openai its OpenAI chat API)."""

from __future__ import annotations

import argparse
from typing import Any


def backend_from_args(description: str) -> tuple[Any, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--url", help="a running forkserve server (default: load the model in this process)")
    ap.add_argument("--api-key", help="the server's API key, if it has one")
    ap.add_argument("--dtype", default="auto", help="in-process engine dtype (auto, float32, bfloat16)")
    ap.add_argument("--openai", action="store_true",
                    help="run through the server's OpenAI chat API (any OpenAI-compatible server; needs --url) "
                         "instead of its native API")
    ns = ap.parse_args()
    if ns.openai and not ns.url:
        ap.error("--openai needs --url")
    import frontend_lang as sgl

    if ns.openai:
        from bench_agent.drivers.openai_chat import OpenAIChatBackend

        return OpenAIChatBackend(ns.url, api_key=ns.api_key), ns
    backend = sgl.RuntimeEndpoint(ns.url, api_key=ns.api_key) if ns.url else sgl.EngineBackend(dtype=ns.dtype)
    return backend, ns
