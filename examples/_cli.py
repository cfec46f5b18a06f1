"""The command line every example shares: in-process engine by default, or a server."""

from __future__ import annotations

import argparse
from typing import Any


def backend_from_args(description: str) -> tuple[Any, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--url", help="a running forkserve server (default: load the model in this process)")
    ap.add_argument("--api-key", help="the server's API key, if it has one")
    ap.add_argument("--dtype", default="auto", help="in-process engine dtype (auto, float32, bfloat16)")
    ns = ap.parse_args()
    import frontend_lang as sgl

    backend = sgl.RuntimeEndpoint(ns.url, api_key=ns.api_key) if ns.url else sgl.EngineBackend(dtype=ns.dtype)
    return backend, ns
