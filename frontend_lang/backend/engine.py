"""The in-process backend: a ``runtime.Engine`` driven by its one background thread.

Programs call from many threads at once (each state has its own executor); the engine's
driver (``engine_driver.EngineDriver``, one per engine, shared by every backend on it) adds
their requests to the scheduler between steps and hands each caller its results, so
concurrent branches share batches exactly as over HTTP. Do not call the wrapped engine
directly while a backend on it is in use.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from frontend_lang.backend.base import Backend, BackendError
from frontend_lang.backend.engine_driver import EngineCall, EngineDriver
from frontend_lang.tools import RenderedChat, ToolUse
from runtime.detokenizer import shown_text
from runtime.incremental_text import IncrementalText
from runtime.scheduler.req import Req


class EngineBackend(Backend):
    def __init__(self, engine: Any = None, **server_args: Any) -> None:
        from runtime.engine import Engine

        self.owns_engine = engine is None  # shut down only an engine we started
        self.engine = engine if engine is not None else Engine(**server_args)
        self._driver = EngineDriver.attach(self.engine)
        self._stopped = False
        self._stop_lock = threading.Lock()

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
        reqs, is_batch = self._build(
            prompt, sampling_params, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num, program_id=program_id,
        )
        call = EngineCall(reqs)
        self._live_driver().send(call)
        call.done.wait()
        if call.error is not None:
            raise BackendError(str(call.error)) from call.error
        outs = [self.engine.format_output(r, return_text_in_logprobs) for r in reqs]
        return outs if is_batch or len(outs) > 1 else outs[0]

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], *, program_id: str | None = None
    ) -> Iterator[dict[str, Any]]:
        reqs, _ = self._build(prompt, sampling_params, stream=True, program_id=program_id)
        if len(reqs) != 1:
            raise BackendError("streaming takes one prompt and n = 1")
        req = reqs[0]
        updates: queue.Queue[Any] = queue.Queue()
        call = EngineCall(reqs, updates)
        self._live_driver().send(call)
        tok = self.engine.tokenizer
        text = IncrementalText()
        while (ids := updates.get()) is not None:
            text.feed(lambda part: tok.decode(part, req.params.skip_special_tokens), ids[len(text.ids) :])
            yield {"text": shown_text(text.text, req.params), "output_ids": list(ids), "meta_info": {"id": req.rid}}
        if call.error is not None:
            raise BackendError(str(call.error)) from call.error
        yield self.engine.format_output(req)

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
        self.run_in_driver(lambda: self.engine.end_program(program_id))

    def flush_cache(self) -> bool:
        return bool(self.run_in_driver(self.engine.flush_cache))

    def get_server_info(self) -> dict[str, Any]:
        """The engine's settings and its scheduler's state (what ``/get_server_info`` holds
        of them)."""
        import dataclasses

        return {**dataclasses.asdict(self.engine.args), **self.run_in_driver(self.engine.core.stats)}

    def run_in_driver(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the driver thread, between steps (the engine is not thread-safe)."""
        return self._live_driver().run(fn)

    @property
    def is_stopped(self) -> bool:
        return self._stopped

    def shutdown(self) -> None:
        """Detach from the engine's driver; a backend that started its engine also stops the
        driver for every other backend on it and shuts the engine down."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        if self.owns_engine:
            self._driver.stop()
            self.engine.shutdown()
        else:
            self._driver.detach()

    # ------------------------------------------------------------------ requests
    def _live_driver(self) -> EngineDriver:
        if self._stopped:  # the driver may live on for other backends; this one is done
            raise BackendError("the engine backend was shut down")
        return self._driver

    def _build(self, prompt: str | list[str], sampling_params: dict[str, Any], **opts: Any) -> tuple[list[Req], bool]:
        try:
            return self.engine.build_requests(prompt, sampling_params, **opts)
        except ValueError as err:
            raise BackendError(str(err)) from err
