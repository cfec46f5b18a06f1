"""forkserve's DSL for branching agent programs, with SGLang's frontend surface:

    import frontend_lang as sgl

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=64))

    sgl.set_default_backend(sgl.RuntimeEndpoint("http://127.0.0.1:30000"))  # or sgl.EngineBackend()
    print(qa.run(question="Name a planet.")["answer"])
"""

from __future__ import annotations

from typing import Any

from frontend_lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from frontend_lang.fork_group import ProgramStateGroup
from frontend_lang.ir import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    separate_reasoning,
    system,
    system_begin,
    system_end,
    tool,
    user,
    user_begin,
    user_end,
    video,
)
from frontend_lang.program import (
    SglFunction,
    flush_cache,
    function,
    get_default_backend,
    get_server_info,
    set_default_backend,
)
from frontend_lang.state import ProgramError, ProgramState
from frontend_lang.tools import ToolCall
from runtime.version import package_version

__all__ = [
    "BackendError",
    "Engine",
    "EngineBackend",
    "ProgramError",
    "ProgramState",
    "ProgramStateGroup",
    "Runtime",
    "RuntimeEndpoint",
    "SglFunction",
    "ToolCall",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "greedy_token_selection",
    "flush_cache",
    "get_default_backend",
    "get_server_info",
    "image",
    "select",
    "separate_reasoning",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "tool",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
]


__version__ = package_version()


def __getattr__(name: str) -> Any:
    # Backends import httpx / the engine: load them on first use.
    if name in ("EngineBackend", "RuntimeEndpoint", "Runtime", "BackendError", "Backend"):
        from frontend_lang import backend

        return getattr(backend, name)
    if name == "Engine":  # SGLang's offline engine: forkserve's
        from runtime.engine import Engine

        return Engine
    if name in _OTHER_BACKENDS:
        raise AttributeError(
            f"sgl.{name}: forkserve's frontend runs programs on a forkserve (or SGLang) server, "
            "RuntimeEndpoint(url), or in this process, Engine(); it has no backend for other APIs"
        )
    if name == "global_config":
        raise AttributeError(
            "sgl.global_config: not in forkserve's frontend; use set_default_backend() / "
            "get_default_backend() for the default backend"
        )
    raise AttributeError(f"module 'frontend_lang' has no attribute {name!r}")


# SGLang's frontend backends for hosted APIs (sglang/lang/backend/).
_OTHER_BACKENDS = ("OpenAI", "Anthropic", "LiteLLM", "VertexAI", "Crusoe")
