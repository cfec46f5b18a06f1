"""SGLang's ``sgl.Runtime``: a ``forkserve serve`` of the program's own, in a child process.

    runtime = sgl.Runtime(max_total_tokens=20_000)   # serve's flags as keyword arguments
    sgl.set_default_backend(runtime)                  # programs talk to it over HTTP
    ...
    runtime.shutdown()                                # also done at interpreter exit

Keyword arguments are ``forkserve serve``'s flags with underscores (``model_path``,
``max_running_requests``, SGLang's names such as ``context_length`` too); they are checked
before the server starts, so a wrong one is a ``TypeError`` / ``ValueError`` at once.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from frontend_lang.backend.runtime_endpoint import RuntimeEndpoint
from runtime.config import DataParallelArgs, HttpArgs, ServerArgs, add_cli_args
from runtime.ipc import free_tcp_port
from runtime.server.server_process import ServerProcess


def serve_flags(**kwargs: Any) -> list[str]:
    """``forkserve serve`` flags for keyword arguments, checked as the command line checks them."""
    flags: list[str] = []
    for name, value in kwargs.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False and not _negatable(flag):
            continue
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    parser = argparse.ArgumentParser(prog="Runtime", exit_on_error=False, add_help=False)
    for cls in (HttpArgs, ServerArgs, DataParallelArgs):
        add_cli_args(parser, cls)
    try:
        ns, unknown = parser.parse_known_args(flags)
    except argparse.ArgumentError as err:
        raise ValueError(f"Runtime(): {err}") from err
    if unknown:
        names = [f[2:].replace("-", "_") for f in unknown if f.startswith("--")]
        raise TypeError(f"Runtime(): unknown argument(s) {', '.join(names) or unknown}; see forkserve serve --help")
    for cls in (HttpArgs, ServerArgs, DataParallelArgs):
        try:
            cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})
        except ValueError as err:  # it names the field, as the keyword argument is named
            raise ValueError(f"Runtime(): {err}") from err
    return flags


def _negatable(flag: str) -> bool:
    """Whether ``--no-<flag>`` exists: boolean flags that are on by default."""
    name = flag[2:].replace("-", "_")
    return any(f.name == name and f.default is True for cls in (HttpArgs, ServerArgs, DataParallelArgs)
               for f in dataclasses.fields(cls))


class Runtime:
    """A forkserve server started for this program (SGLang's ``Runtime``); ``endpoint`` is
    its ``RuntimeEndpoint``, which ``set_default_backend`` and ``run(backend=...)`` use."""

    def __init__(self, log_level: str = "error", launch_timeout: float = 300.0, *args: Any, **kwargs: Any) -> None:
        if args:  # SGLang's ServerArgs takes the model path first
            kwargs = {"model_path": args[0], **kwargs}
        port = kwargs.pop("port", None) or free_tcp_port()
        flags = serve_flags(**kwargs)
        self.log_level = log_level  # the server's log goes to a file either way (``log``)
        self.server = ServerProcess(*flags, port=port)
        self.url = self.server.url
        self.generate_url = self.url + "/generate"
        atexit.register(self.shutdown)
        try:
            self.server.wait_ready(launch_timeout)
        except Exception:
            self.shutdown()
            raise
        self.endpoint = RuntimeEndpoint(self.url, api_key=kwargs.get("api_key"))

    @property
    def log(self) -> str:
        """What the server printed so far."""
        return self.server.read_output()

    def shutdown(self) -> None:
        """Stop the server and its processes (nothing is left running)."""
        if self.server.proc.poll() is None:
            self.server.stop()
        endpoint = getattr(self, "endpoint", None)
        if endpoint is not None:
            endpoint.shutdown()

    def cache_prefix(self, prefix: str) -> None:
        self.endpoint.cache_prefix(prefix)

    def get_tokenizer(self) -> Any:
        """The served model's Hugging Face tokenizer."""
        from transformers import AutoTokenizer

        from runtime.model_loader.default_model import resolve_model_path

        return AutoTokenizer.from_pretrained(resolve_model_path(self.endpoint.model_info.get("model_path")))

    def generate(self, prompt: str | list[str], sampling_params: dict[str, Any] | None = None,
                 return_logprob: bool | list[bool] = False, logprob_start_len: int | list[int] | None = None,
                 top_logprobs_num: int | list[int] | None = None) -> str:
        """``/generate``'s answer as JSON text, as SGLang's ``Runtime.generate`` gives it."""
        body: dict[str, Any] = {"text": prompt, "sampling_params": sampling_params or {},
                                "return_logprob": return_logprob}
        if logprob_start_len is not None:
            body["logprob_start_len"] = logprob_start_len
        if top_logprobs_num is not None:
            body["top_logprobs_num"] = top_logprobs_num
        return json.dumps(self.endpoint._post("/generate", body))  # noqa: SLF001

    async def async_generate(self, prompt: str, sampling_params: dict[str, Any] | None = None) -> AsyncIterator[str]:
        """The new text of each streamed chunk, as SGLang's ``Runtime.async_generate``."""
        import asyncio

        chunks = iter(self.endpoint.generate_stream(prompt, sampling_params or {}))
        done = object()
        shown = 0
        while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
            text = chunk["text"]  # type: ignore[index]
            if len(text) > shown:
                yield text[shown:]
                shown = len(text)

    add_request = async_generate
