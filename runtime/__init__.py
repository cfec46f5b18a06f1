"""Everything that runs a server: config, engine, scheduler, worker, models, sampling."""

from __future__ import annotations

from typing import Any

__all__ = ["Engine", "ServerArgs"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import runtime.config` does not load transformers and the model code.
    if name == "Engine":
        from runtime.engine import Engine

        return Engine
    if name == "ServerArgs":
        from runtime.config import ServerArgs

        return ServerArgs
    raise AttributeError(name)
