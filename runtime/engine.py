"""The offline engine: the whole server in one process, driven by ``generate``.

Where things happen: a request enters in ``Engine.generate`` (tokenized here, checked by
``runtime/request_builder.py`` as over HTTP), is stepped by the engine core
(``runtime/scheduler/core.py``), gets its KV slots in
``runtime/scheduler/cache_manager.py`` and its tokens sampled in
``runtime/sampling/sampler.py`` via ``runtime/executor/worker.py``.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import gc
import itertools
import time
from collections.abc import Callable, Iterator, KeysView
from typing import Any, TypeVar

from tqdm import tqdm

from runtime.config import ServerArgs
from runtime.core_stepper import CoreStepper, Progress
from runtime.detokenizer import shown_text
from runtime.engine_streams import CancellableCall, RequestStream, async_outputs, on_own_thread
from runtime.executor.worker import ModelWorker
from runtime.incremental_text import IncrementalText
from runtime.model_loader import resolve_model_path
from runtime.output_format import logprob_meta
from runtime.process_memory import glibc_trim
from runtime.request_builder import (
    RequestLimits,
    build_requests,
    one_per_prompt,
    parse_sampling_params,
    score_each_prompt_once,
)
from runtime.request_options import RequestOptions
from runtime.scheduler.core import EngineCore
from runtime.scheduler.req import Req
from runtime.scheduler.scheduler import Scheduler
from runtime.tokenizer import Tokenizer

T = TypeVar("T")
# what a non-streamed ``generate`` tells its requests to once they are queued (``async_generate``)
_ON_QUEUED: contextvars.ContextVar[Callable[[list[Req]], None] | None] = contextvars.ContextVar("on_queued", default=None)


# Keywords of SGLang's Engine.generate this engine has no use for, and their defaults.
SGLANG_UNSET: dict[str, Any] = {
    "image_data": None, "audio_data": None, "video_data": None, "lora_path": None, "custom_logit_processor": None,
    "return_hidden_states": False, "return_routed_experts": False, "bootstrap_host": None, "bootstrap_port": None,
    "bootstrap_room": None, "data_parallel_rank": None, "external_trace_header": None,
}


def check_unset_sglang_fields(given: dict[str, Any]) -> None:
    """``TypeError`` for a keyword neither engine has (as Python's own), ``ValueError`` for
    one of ``SGLANG_UNSET`` set: anything but its default (None, or a list of Nones for a
    batch; False)."""
    for name, value in given.items():
        if name not in SGLANG_UNSET:
            raise TypeError(f"Engine.generate() got an unexpected keyword argument '{name}'")
        default = SGLANG_UNSET[name]
        unset = (value is None or (isinstance(value, list) and all(v is None for v in value))) if default is None \
            else value is False
        if not unset:
            raise ValueError(f"{name} is not supported by this engine (leave it at {default!r})")


class Engine:
    """``Engine(model_path=None, **server_args)``; see ``forkserve --help`` for the arguments.

    Threads may share an engine: a call queues its requests (an inbox, never waiting for a
    step) and waits for them; one thread of the engine's own steps the core while any are
    queued or running, so the requests of callers that overlap run in the same batches.
    Ctrl-C during a call aborts that call's requests (a step in progress ends first). After
    ``shutdown``, or a step that raised, every call raises."""

    def __init__(self, model_path: str | None = None, **server_args: Any) -> None:
        self.args = ServerArgs.from_kwargs(model_path=model_path, **server_args)
        self.model_dir = resolve_model_path(self.args.model_path)
        self.tokenizer = Tokenizer(self.model_dir)
        self.core = EngineCore(self.args, self.model_dir, self.tokenizer)
        self._rids = itertools.count()
        self._steps = CoreStepper(self.core)  # who steps the core, and when

    @property
    def worker(self) -> ModelWorker:
        return self.core.worker

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def has_work(self) -> bool:
        """Requests are queued or running (a caller's not yet handed to the core too)."""
        return self._steps.has_work

    # ------------------------------------------------------------------ public API
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        return_text_in_logprobs: bool = False,
        namespace: Any = None,
        progress: bool = False,
        program_id: str | None = None,
        stream: bool = False,
        rid: str | list[str] | None = None,
        token_ids_logprob: Any = None,
        **unset_sglang_fields: Any,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """Generate for one prompt (returns a dict) or a batch (returns a list of dicts),
        shaped like SGLang's ``/generate`` response. Invalid input raises ``ValueError``
        before anything is queued. The logprob options take one value or a list of one per
        prompt (None: the default), as SGLang's. ``rid``: the requests' ids (a list: one per
        request), else ``req-N``. ``program_id`` keeps the prompt cached until
        ``end_program(program_id)``. ``stream``: an iterator of outputs instead (``_stream``),
        as SGLang's ``Engine.generate(stream=True)``; each output has every logprob so far
        (use it in a ``with`` block: leaving it aborts what is unfinished). SGLang's other
        keywords (``image_data``, ``lora_path``, ...: ``SGLANG_UNSET``) are taken at their
        defaults, as code written for its Engine passes them; set, a ``ValueError``."""
        self._check_open()
        if token_ids_logprob is not None:
            raise ValueError("token_ids_logprob is not supported by this engine (top_logprobs_num is)")
        check_unset_sglang_fields(unset_sglang_fields)
        reqs, is_batch, prompt_source = self.build_requests(
            prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num, namespace,
            stream=stream, program_id=program_id,
        )
        if stream:
            self._queue(reqs, rid)
            return RequestStream(self, reqs, self._stream(reqs, is_batch or len(reqs) > 1, return_text_in_logprobs))
        try:
            self._queue(reqs, rid)
            if (on_queued := _ON_QUEUED.get()) is not None:
                on_queued(reqs)
            self._run_until_done(reqs, progress)
        except BaseException:  # Ctrl-C (taken between steps), or a failed step: this call's requests go
            self.abort_unfinished(reqs)
            raise
        failed = next((r for r in reqs if r.error is not None), None)
        if failed is not None:  # e.g. a grammar that did not compile in time
            raise ValueError(failed.error)
        outs = [self.format_output(r, return_text_in_logprobs, reqs[k]) for r, k in zip(reqs, prompt_source, strict=True)]
        return outs if is_batch or len(outs) > 1 else outs[0]

    async def async_generate(self, *args: Any, **kwargs: Any) -> Any:
        """``generate`` for asyncio, as SGLang's: it runs on a worker thread (threads may share
        the engine); with ``stream=True``, an async iterator of the outputs (closing it early
        aborts their requests). Cancelling the call aborts its requests."""
        if kwargs.get("stream"):
            return async_outputs(await asyncio.to_thread(self.generate, *args, **kwargs))
        call = CancellableCall(self)
        hook = _ON_QUEUED.set(call.queued)  # in this task's context, which ``to_thread`` copies
        try:
            return await asyncio.to_thread(self.generate, *args, **kwargs)
        except asyncio.CancelledError:
            # on a thread of its own: the default pool's may all be held by calls waiting for
            # their requests; shielded: a second cancel does not stop the abort
            await asyncio.shield(on_own_thread(call.cancel))
            raise
        finally:
            _ON_QUEUED.reset(hook)

    def get_model_info(self) -> dict[str, Any]:
        """SGLang's ``Engine.get_model_info``: what a server's ``GET /get_model_info`` says."""
        return {"model_path": str(self.model_dir), "tokenizer_path": str(self.model_dir), "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default",
                "max_context_len": self.scheduler.max_context_len}

    def get_server_info(self) -> dict[str, Any]:
        """SGLang's ``Engine.get_server_info``: the engine's arguments, and its scheduler's
        state as a server's ``GET /get_server_info`` gives it."""
        with self._steps.core_access():
            self._check_open()
            stats = self.core.stats()
        return {**dataclasses.asdict(self.args), "chunked_prefill_size": self.scheduler.chunk_tokens,
                "model_path": str(self.model_dir), "scheduler": stats}

    def build_requests(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        namespace: Any = None,
        stream: bool = False,
        program_id: str | None = None,
    ) -> tuple[list[Req], bool, list[int]]:
        """Validate and tokenize; the ``Req``s to queue (``n`` expanded), whether the input
        was a batch, and for each the index of the one whose prompt logprobs it reports
        (not streamed: ``score_each_prompt_once``). Raises ``ValueError`` naming the problem
        (the checks are ``runtime/request_builder.py``'s, as over HTTP)."""
        prompts, is_batch = self._prompt_ids(prompt, input_ids)
        n = len(prompts)
        logprobs = zip(one_per_prompt(return_logprob, "return_logprob", n),
                       one_per_prompt(logprob_start_len, "logprob_start_len", n),
                       one_per_prompt(top_logprobs_num, "top_logprobs_num", n), strict=True)
        options = [RequestOptions(stream, False if want is None else want, -1 if start is None else start, 0 if top is None else top,
                                  namespace, program_id) for want, start, top in logprobs]
        requests = build_requests(prompts, parse_sampling_params(sampling_params, n), options,
                                  self.limits, prompt_field="prompt" if input_ids is None else "input_ids")
        requests, prompt_source = score_each_prompt_once(requests, each_own=stream)  # aborts are per call
        reqs = [Req(f"req-{next(self._rids)}", r.input_ids, r.params, r.options) for r in requests]
        if len(reqs) > 1:  # one call's requests are ordered fairly against other calls'
            for req in reqs:
                req.group = reqs[0].rid
        return reqs, is_batch, prompt_source

    def _queue(self, reqs: list[Req], rid: str | list[str] | None) -> None:
        """Name ``reqs`` and put them in the inbox (``CoreStepper.queue``): ``rid`` itself (one
        request), ``rid_0``, ``rid_1``, ... (several), a list of one each, or else their own
        ``req-N`` (another one where a caller's rid took it). An id that a request here
        already has is refused (aborts go by id)."""
        count = len(reqs)
        if rid is not None and not isinstance(rid, str) and not (
                isinstance(rid, list) and len(rid) == count and all(isinstance(r, str) for r in rid)):
            raise ValueError(f"rid must be a string or a list of {count} strings (one per request), got {rid!r}")

        def ids_for(busy: KeysView[str]) -> list[str]:
            if rid is None:
                ids = [r.rid for r in reqs]
                for i, req_id in enumerate(ids):
                    while req_id in busy:
                        req_id = f"req-{next(self._rids)}"
                    ids[i] = req_id
                return ids
            ids = ([rid] if count == 1 else [f"{rid}_{i}" for i in range(count)]) if isinstance(rid, str) else rid
            taken = sorted(set(ids) & busy) or sorted({i for i in ids if ids.count(i) > 1})
            if taken:
                raise ValueError(f"rid {taken[0]!r} is already in use")
            return ids

        self._steps.queue(reqs, ids_for)

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(self.worker.model_config.vocab_size, self.scheduler.max_context_len,
                             self.scheduler.allocator.capacity, self.args.allow_auto_truncate, self.args.max_logprobs)

    def end_program(self, program_id: str) -> None:
        """Release the cache pins of ``program_id`` (see ``runtime/scheduler/program_pins.py``)."""
        with self._steps.core_access():
            self._check_open()
            self.core.end_program(program_id)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests are queued or running."""
        with self._steps.core_access():
            self._check_open()
            self._steps.take_inbox()
            return self.core.flush_cache()

    def abort_unfinished(self, reqs: list[Req]) -> None:
        """Drop those of ``reqs`` still queued or running (their computed KV stays cached)."""
        self._steps.abort(reqs)

    def shutdown(self) -> None:
        """End the engine (its core checks that no KV slot leaked) and give its memory back
        (the weights and the KV pool, also where the engine stays referenced, as in a
        notebook that makes a new one); calls after it raise."""
        self._steps.shutdown()
        gc.collect()
        if (trim := glibc_trim()) is not None:  # glibc keeps what was freed (the worker's setting)
            trim()

    def _check_open(self) -> None:
        self._steps.check_open()

    def between_steps(self, fn: Callable[[], T]) -> T:
        """``fn()`` while no step runs (other threads may be using the engine)."""
        with self._steps.core_access():
            self._check_open()
            return fn()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ helpers
    def _stream(self, reqs: list[Req], indexed: bool, text_in_logprobs: bool) -> Iterator[dict[str, Any]]:
        """An output each time a step gives a request tokens: the text so far (SGLang's
        cumulative form) without a partial character or a tail that may still become a stop
        string; a request's last output is ``generate``'s whole one. ``index`` says whose, when
        there are several. Closing the iterator early aborts the requests not yet finished."""
        texts = [IncrementalText() for _ in reqs]
        open_reqs = set(range(len(reqs)))
        seen: Progress | None = None
        try:
            while open_reqs:
                seen = self._steps.wait_for_news(reqs, seen)
                for i, (length, finished) in enumerate(seen):
                    req, text = reqs[i], texts[i]
                    if i not in open_reqs:
                        continue
                    if finished:
                        open_reqs.discard(i)
                        if req.error is not None:  # e.g. a grammar that did not compile in time
                            raise ValueError(req.error)
                        chunk = self.format_output(req, text_in_logprobs)
                    elif length > len(text.ids):
                        skip = req.params.skip_special_tokens
                        text.context = req.decode_context  # set by EngineCore.add_request, done by now
                        text.feed(lambda ids, skip=skip: self.tokenizer.decode(ids, skip), req.output_ids[len(text.ids):length])
                        chunk = {"text": shown_text(text.text, req.params), "output_ids": req.output_ids[:length],
                                 "meta_info": self._meta_info(req, text_in_logprobs, length)}
                    else:
                        continue
                    if indexed:
                        chunk["index"] = i
                    yield chunk
        finally:
            self.abort_unfinished([reqs[i] for i in open_reqs])

    def _run_until_done(self, reqs: list[Req], progress: bool) -> None:
        """Wait until every request of this call is done (Ctrl-C: ``generate`` aborts them).
        The progress bar counts tokens (a finished request: all it could have had), so one
        long answer shows progress too."""
        bar = tqdm(total=sum(r.params.max_new_tokens for r in reqs), desc="generate", unit="tok", disable=not progress)
        seen: Progress | None = None
        try:
            while seen is None or not all(finished for _, finished in seen):
                seen = self._steps.wait_for_news(reqs, seen)
                if progress:
                    done = sum(r.params.max_new_tokens if finished else length for r, (length, finished) in zip(reqs, seen, strict=True))
                    bar.update(done - bar.n)
        finally:
            bar.close()

    def _prompt_ids(self, prompt: Any, input_ids: Any) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt or input_ids")
        if prompt is not None:
            texts, is_batch = ([prompt], False) if isinstance(prompt, str) else (prompt, True)
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise ValueError("prompt must be a string or a list of strings")
            if not texts:
                raise ValueError("prompt is an empty list")
            ids = [self.tokenizer.encode(t) for t in texts]
        else:
            if not isinstance(input_ids, list):
                raise ValueError(f"input_ids must be a list of token ids or a list of such lists, got {type(input_ids).__name__}")
            is_batch = bool(input_ids) and isinstance(input_ids[0], list)
            ids = input_ids if is_batch else [input_ids]
            for row in ids:
                if not isinstance(row, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
                    raise ValueError("input_ids must be a list of token ids or a list of such lists")
        return ids, is_batch

    def format_output(self, req: Req, text_in_logprobs: bool = False, prompt_scored_by: Req | None = None) -> dict[str, Any]:
        return {
            "text": self.tokenizer.output_text(req.output_ids, req.finished_reason, req.params, req.decode_context),
            "output_ids": list(req.output_ids),
            "meta_info": self._meta_info(req, text_in_logprobs, prompt_scored_by=prompt_scored_by),
        }

    def _meta_info(self, req: Req, text_in_logprobs: bool, unfinished_at: int | None = None,
                   prompt_scored_by: Req | None = None) -> dict[str, Any]:
        """``unfinished_at``: as it was when it had that many output tokens, unfinished (a
        stream reads between steps, but the next step may have begun appending).
        ``prompt_scored_by``: the request whose prompt logprobs to report (another sample of
        the prompt)."""
        scored = prompt_scored_by or req
        length = len(req.output_ids) if unfinished_at is None else unfinished_at
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": req.finished_reason if unfinished_at is None else None,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": length,
            "cached_tokens": req.cached_tokens,
            "e2e_latency": (req.finished_at or time.perf_counter()) - req.created_at,
        }
        if req.options.return_logprob:
            meta.update(
                logprob_meta(
                    scored.input_token_logprobs,
                    scored.input_top_logprobs,
                    req.output_token_logprobs[:length],
                    req.output_top_logprobs[:length],
                    self.tokenizer.id_to_text if text_in_logprobs else None,
                )
            )
        return meta
