"""The in-process backend: a ``runtime.Engine`` driven by one background thread.

Programs call from many threads at once (each state has its own executor); the driver
thread owns the engine, adds their requests to the scheduler between steps and hands each
caller its results, so concurrent branches share batches exactly as over HTTP. Do not call
the wrapped engine directly while the backend is in use.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from frontend_lang.backend.base import Backend, BackendError
from frontend_lang.tools import RenderedChat, ToolUse
from runtime.detokenizer import IncrementalText, visible_text
from runtime.scheduler.core import RequestOutput
from runtime.scheduler.req import Req


class _Call:
    """Requests of one caller, and how the driver reports back."""

    def __init__(self, reqs: list[Req], updates: queue.Queue[Any] | None = None) -> None:
        self.reqs = reqs
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.updates = updates  # streaming: a snapshot of output ids after each step, then None


class EngineBackend(Backend):
    def __init__(self, engine: Any = None, **server_args: Any) -> None:
        from runtime.engine import Engine

        self.owns_engine = engine is None  # shut down only an engine we started
        self.engine = engine if engine is not None else Engine(**server_args)
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._calls: dict[Req, _Call] = {}
        self._broken: BaseException | None = None
        self._stopped = False
        # Guards the inbox once the driver has stopped: what is sent after that is refused
        # at once, and what was queued before it is answered by the driver on its way out.
        self._gate = threading.Lock()
        self._closed: BaseException | None = None
        self._thread = threading.Thread(target=self._drive, daemon=True, name="forkserve-engine-driver")
        self._thread.start()

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
        call = _Call(reqs)
        self._send(call)
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
        call = _Call(reqs, updates)
        self._send(call)
        tok = self.engine.tokenizer
        text = IncrementalText()
        while (ids := updates.get()) is not None:
            text.feed(tok, ids[len(text.ids) :], req.params.skip_special_tokens)
            yield {"text": visible_text(text.text, tuple(req.params.stop)), "output_ids": list(ids), "meta_info": {"id": req.rid}}
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

    def run_in_driver(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the driver thread, between steps (the engine is not thread-safe)."""
        fut: Future[Any] = Future()
        self._send((fn, fut))
        return fut.result()

    @property
    def is_stopped(self) -> bool:
        return self._stopped

    def shutdown(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._inbox.put(None)
            self._thread.join(30)
            if self.owns_engine:
                self.engine.shutdown()

    # ------------------------------------------------------------------ driver
    def _build(self, prompt: str | list[str], sampling_params: dict[str, Any], **opts: Any) -> tuple[list[Req], bool]:
        try:
            return self.engine.build_requests(prompt, sampling_params, **opts)
        except ValueError as err:
            raise BackendError(str(err)) from err

    def _send(self, item: _Call | tuple[Callable[[], Any], Future[Any]]) -> None:
        """Queue ``item`` for the driver; ``BackendError`` once the driver has stopped."""
        with self._gate:
            if self._closed is not None:
                raise BackendError(str(self._closed))
            self._inbox.put(item)

    def _drive(self) -> None:
        try:
            self._drive_until_stopped()
        except BaseException as err:  # a bug in the driver itself: callers are told what it was
            self._broken = self._broken or err
            raise
        finally:  # nothing queued or sent later waits for ever
            with self._gate:
                self._closed = (BackendError(f"the engine failed earlier: {self._broken}") if self._broken is not None
                                else BackendError("the engine backend was shut down"))
            while True:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, tuple):
                    item[1].set_exception(self._closed)
                elif item is not None:
                    self._finish(item, self._closed)
            for call in set(self._calls.values()):
                self._finish(call, self._closed)
            self._calls.clear()

    def _drive_until_stopped(self) -> None:
        """The in-process driver of the engine core: take callers' requests between steps,
        step, hand each caller its outputs."""
        core = self.engine.core
        while True:
            items = [self._inbox.get()] if not core.has_work else []
            while True:
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for k, item in enumerate(items):
                if item is None:
                    for rest in items[k + 1 :]:  # answered on the way out (``_drive``)
                        self._inbox.put(rest)
                    return
                self._accept(item)
            if not core.has_work:
                continue
            try:
                outputs = core.step()
            except Exception as err:  # the engine is in an unknown state: fail everyone
                self._broken = err
                for call in set(self._calls.values()):
                    self._finish(call, err)
                self._calls.clear()
                return
            self._report(outputs)

    def _accept(self, item: Any) -> None:
        if isinstance(item, tuple):
            fn, fut = item
            try:
                fut.set_result(fn())
            except Exception as err:
                fut.set_exception(err)
            return
        call: _Call = item
        try:
            for req in call.reqs:
                self.engine.core.add_request(req)
        except ValueError as err:
            for req in call.reqs:  # added ones run to the end unobserved; drop their records
                self._calls.pop(req, None)
            self._finish(call, err)
            return
        for req in call.reqs:
            self._calls[req] = call

    def _report(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            req = out.req
            call = self._calls.get(req)
            if call is None:
                continue
            if call.updates is not None and not req.is_finished:
                call.updates.put(list(req.output_ids))
            if req.is_finished:
                del self._calls[req]
                if all(r.is_finished for r in call.reqs):
                    failed = next((r.error for r in call.reqs if r.error is not None), None)
                    self._finish(call, ValueError(failed) if failed else None)

    @staticmethod
    def _finish(call: _Call, error: BaseException | None) -> None:
        call.error = error
        if call.updates is not None:
            call.updates.put(None)
        call.done.set()
