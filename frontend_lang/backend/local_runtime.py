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
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from typing import Any

from frontend_lang.backend.runtime_endpoint import RuntimeEndpoint
from runtime.arg_fields import args_from_namespace
from runtime.cli import SERVE_ARGS, add_serve_args
from runtime.cli_foreign_flags import hints
from runtime.ipc import free_tcp_port
from runtime.server.server_process import ServerProcess


def serve_flags(**kwargs: Any) -> list[str]:
    """``forkserve serve`` flags for keyword arguments, checked as the command line checks them."""
    parser = argparse.ArgumentParser(prog="Runtime", exit_on_error=False, add_help=False)
    add_serve_args(parser)
    known = {option for action in parser._actions for option in action.option_strings}  # noqa: SLF001
    unknown = [name for name in kwargs if "--" + name.replace("_", "-") not in known]
    if unknown:  # SGLang's or vLLM's names: what to give instead, as the command line says
        said = hints(["--" + name for name in unknown])
        raise TypeError("\n".join([f"Runtime(): unknown argument(s) {', '.join(unknown)}; see forkserve serve --help",
                                    *said]))
    flags: list[str] = []
    for name, value in kwargs.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):  # a switch: on, off where it is on by default, else nothing to say
            flags += [flag] if value else ["--no-" + flag[2:]] if "--no-" + flag[2:] in known else []
        elif value is not None:
            flags += [flag, str(value)]
    try:
        ns = parser.parse_args(flags)
    except argparse.ArgumentError as err:
        raise ValueError(f"Runtime(): {err}") from err
    for cls in SERVE_ARGS:
        try:
            args_from_namespace(ns, cls, as_flags=False)  # the error names the field, as the argument is named
        except ValueError as err:
            raise ValueError(f"Runtime(): {err}") from err
    return flags


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
            self.endpoint = RuntimeEndpoint(self.url, api_key=kwargs.get("api_key"))
        except BaseException:  # Ctrl-C while it loads too: no server is left without an owner
            self.shutdown()
            raise

    @property
    def log(self) -> str:
        """What the server printed (so far, or until it was shut down)."""
        return self.server.output if self.server.log.closed else self.server.read_output()

    def shutdown(self) -> None:
        """Stop the server and its processes (nothing is left running); again is a no-op."""
        atexit.unregister(self.shutdown)
        endpoint = getattr(self, "endpoint", None)  # none when the server did not start
        if endpoint is not None:
            endpoint.shutdown()
        if self.server.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):  # it was killed then
                self.server.stop()
        if not self.server.log.closed:
            self.server.read_output()  # kept as server.output: the file goes with the close
            self.server.log.close()

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
        """``/generate``'s answer as JSON text, as SGLang's ``Runtime.generate`` gives it (an
        error's JSON body too)."""
        body: dict[str, Any] = {"text": prompt, "sampling_params": sampling_params or {},
                                "return_logprob": return_logprob}
        if logprob_start_len is not None:
            body["logprob_start_len"] = logprob_start_len
        if top_logprobs_num is not None:
            body["top_logprobs_num"] = top_logprobs_num
        return json.dumps(self.endpoint._post_response("/generate", body).json())  # noqa: SLF001

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
