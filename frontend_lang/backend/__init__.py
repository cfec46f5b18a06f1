"""DSL backends: ``EngineBackend`` (in-process), ``RuntimeEndpoint`` (HTTP) and ``Runtime``
(a server of the program's own, used over HTTP).

Both load on first use: the engine backend imports torch and transformers, which a program
that only talks to a server (or ``forkserve --help``) should not wait for.
"""

from __future__ import annotations

import importlib
from typing import Any

from frontend_lang.backend.base import Backend, BackendError

_LAZY = {"EngineBackend": "frontend_lang.backend.engine", "RuntimeEndpoint": "frontend_lang.backend.runtime_endpoint",
         "Runtime": "frontend_lang.backend.local_runtime"}

__all__ = ["Backend", "BackendError", "EngineBackend", "Runtime", "RuntimeEndpoint"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
