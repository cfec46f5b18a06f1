"""The command line every example shares: in-process engine by default, or a server (its
native API, or with --openai its OpenAI chat API)."""

from __future__ import annotations

import argparse
from typing import Any

# Why an example cannot run through an OpenAI chat API (its --openai is refused up front).
NEEDS_LOGPROBS = "it picks with select(), which needs prompt logprobs, and a chat API returns none"
GENERATES_MID_TURN = "it generates inside a turn it has begun, and a chat API only writes whole assistant turns"


def backend_from_args(description: str, not_over_openai: str | None = None) -> tuple[Any, argparse.Namespace]:
    """The backend the flags ask for; ``not_over_openai``: why this example refuses --openai."""
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
    if ns.openai and not_over_openai:
        ap.error(f"this example cannot run with --openai: {not_over_openai}; drop --openai to use the server's "
                 "native API")
    import frontend_lang as sgl

    try:  # a server that cannot be reached, or refuses: one line, not a traceback
        if ns.openai:
            from bench_agent.drivers.openai_chat import OpenAIChatBackend

            return OpenAIChatBackend(ns.url, api_key=ns.api_key), ns
        backend = sgl.RuntimeEndpoint(ns.url, api_key=ns.api_key) if ns.url else sgl.EngineBackend(dtype=ns.dtype)
    except sgl.BackendError as err:
        ap.exit(1, f"{ap.prog}: {err}\n")
    return backend, ns
