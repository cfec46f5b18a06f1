"""The in-process backend: a ``runtime.Engine`` called from the program's threads.

Programs call from many threads at once (each state has its own executor). The engine is
made for that: a call queues its requests without waiting for the step in progress, and
whichever caller steps next runs everyone's, so concurrent branches share batches exactly
as over HTTP. Several backends, and direct ``engine.generate`` calls, may share one engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from frontend_lang.backend.base import Backend, BackendError
from frontend_lang.tools import RenderedChat, ToolUse

T = TypeVar("T")


class EngineBackend(Backend):
    def __init__(self, engine: Any = None, **server_args: Any) -> None:
        from runtime.engine import Engine

        self.owns_engine = engine is None  # shut down only an engine we started
        self.engine: Engine = engine if engine is not None else Engine(**server_args)
        self._stopped = False
        self.between_steps(lambda: None)  # an engine that failed or was shut down: BackendError now

    # ------------------------------------------------------------------ Backend
    def generate(
        self,
        prompt: str | list[str],
        sampling_params: dict[str, Any],
        *,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        return_text_in_logprobs: bool = False,
        program_id: str | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        with self._engine_errors(ValueError, RuntimeError):
            return self.engine.generate(  # type: ignore[return-value]
                prompt, sampling_params, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs,
                program_id=program_id,
            )

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], *, program_id: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """The output so far after each step that added to it (text without a tail that may
        still become a stop string), then the whole output. Closing it early aborts the request."""
        if not isinstance(prompt, str) or sampling_params.get("n", 1) != 1:
            raise BackendError("streaming takes one prompt and n = 1")
        with self._engine_errors(ValueError, RuntimeError), \
                contextlib.closing(self.engine.generate(prompt, sampling_params, stream=True,
                                                        program_id=program_id)) as outputs:
            yield from outputs  # type: ignore[misc]

    def role_markers(self) -> dict[str, Any]:
        return self.engine.tokenizer.role_markers()

    def chat_prompt(self, messages: list[dict[str, Any]], tools: ToolUse | None,
                    add_generation_prompt: bool = True) -> RenderedChat:
        """As ``forkserve serve`` renders chats by default (the model's template, or the tool
        template shipped for its format; the parser its template implies)."""
        from runtime.server.tools.chat_prompt import render_chat

        fields = {"tool_choice": tools.choice, "parallel_tool_calls": tools.parallel} if tools else {}
        try:
            prompt = render_chat(self.engine.tokenizer.hf, messages, tools.tools if tools else None,
                                 add_generation_prompt=add_generation_prompt, **fields)
        except ValueError as err:
            raise BackendError(str(err)) from err
        constraint = {"ebnf": prompt.tool_ebnf} if prompt.tool_ebnf else {}
        return RenderedChat(prompt.text, constraint, prompt.tool_parser.name if prompt.tool_parser else None)

    def end_program(self, program_id: str) -> None:
        self.between_steps(lambda: self.engine.core.end_program(program_id))

    def flush_cache(self) -> bool:
        with self._engine_errors(RuntimeError):
            return self.engine.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        """The engine's settings and its scheduler's state (what ``/get_server_info`` holds
        of them)."""
        return {**dataclasses.asdict(self.engine.args), **self.between_steps(self.engine.core.stats)}

    def between_steps(self, fn: Callable[[], T]) -> T:
        """``fn()`` while no step runs (other threads may be stepping the engine)."""
        with self._engine_errors(RuntimeError):
            return self.engine.between_steps(fn)

    @property
    def is_stopped(self) -> bool:
        return self._stopped

    def shutdown(self) -> None:
        """This backend is done; one that started its engine shuts the engine down, for every
        other user of it too (their calls then fail with ``BackendError``)."""
        if self._stopped:
            return
        self._stopped = True
        if self.owns_engine:
            self.engine.shutdown()

    @contextlib.contextmanager
    def _engine_errors(self, *kinds: type[Exception]) -> Iterator[None]:
        """A call on the engine from a live backend; its errors of ``kinds`` as ``BackendError``."""
        self._check_live()
        try:
            yield
        except kinds as err:
            raise BackendError(str(err)) from err

    def _check_live(self) -> None:
        if self._stopped:
            raise BackendError("the engine backend was shut down")
