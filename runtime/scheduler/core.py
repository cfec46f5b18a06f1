"""The engine core: the one owner of the model worker and the scheduler, and the only code
that steps the scheduler.

Two drivers sit on it, each a thin loop that feeds it requests and routes its outputs:
the offline ``Engine`` (``runtime/engine.py``; the DSL's in-process backend,
``frontend_lang/backend/engine.py``, calls it) and the scheduler process's ZMQ loop
(``runtime/scheduler/process.py``). What they get back from ``step`` is the same:
one ``RequestOutput`` per request with something to report — every new token of a
streaming request, and each request once when it finishes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.config import ServerArgs
from runtime.constrained.auto_backend import AutoGrammarBackend
from runtime.executor.tp_worker import start_tp_peers
from runtime.executor.worker import ModelWorker, prepare_process
from runtime.incremental_text import partial_char_context
from runtime.scheduler.req import Req
from runtime.scheduler.scheduler import Scheduler
from runtime.tokenizer import Tokenizer


@dataclass
class RequestOutput:
    """A request's tokens not reported before: ``req.output_ids[start:start + num_new]``."""

    req: Req
    start: int
    num_new: int
    finished: bool  # the request ended with this output
    error: str | None = None  # the request failed alone (e.g. it can never fit the pool)

    @property
    def new_ids(self) -> list[int]:
        return self.req.output_ids[self.start : self.start + self.num_new]


class EngineCore:
    """``add_request``, ``abort``, ``step -> outputs``, ``stats``; not thread-safe (one
    driver thread calls it)."""

    def __init__(self, args: ServerArgs, model_dir: Path, tokenizer: Tokenizer) -> None:
        prepare_process(args)  # a device or backend that cannot run here fails before anything starts
        peers = start_tp_peers(args, model_dir) if args.tp_size > 1 else None
        self.worker = ModelWorker(args, model_dir, tokenizer.eos_token_ids, peers=peers)
        vocab_size, eos = self.worker.model_config.vocab_size, tokenizer.eos_token_ids
        self.scheduler = Scheduler(
            # stop strings are matched against the text with special tokens, as SGLang does
            args, self.worker, lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            make_grammar_backend=lambda: AutoGrammarBackend(tokenizer.hf, vocab_size, eos),
            encode=lambda text: tokenizer.hf.encode(text, add_special_tokens=False),
        )
        self._ends_inside_character = tokenizer.token_bytes.ends_inside_character
        self._reported: dict[str, int] = {}  # rid -> output tokens already reported
        self.stream_interval = args.stream_interval
        self.num_finished = 0
        self._idle_checked = True

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add_request(self, req: Req) -> None:
        """Queue ``req``; raises ``ValueError`` (queuing nothing) if it can never run here."""
        req.decode_context = partial_char_context(req.input_ids, self._ends_inside_character)
        self.scheduler.add_request(req)
        self._reported[req.rid] = 0

    def reject(self, req: Req, err: ValueError) -> RequestOutput:
        """The output of a request ``add_request`` refused: finished, with the reason."""
        req.finished_reason = {"type": "abort", "message": str(err)}
        req.finished_at = time.perf_counter()
        self.num_finished += 1
        return RequestOutput(req, 0, 0, True, error=str(err))

    def abort(self, rid: str, message: str = "aborted by the client") -> list[RequestOutput]:
        """Drop request ``rid`` (see ``Scheduler.abort``); its final output (everything not yet
        reported, with an ``abort`` finish reason saying ``message``), if it was here."""
        req = self.scheduler.abort(rid, message)
        return self._outputs([req]) if req is not None else []

    def step(self) -> list[RequestOutput]:
        """Run one batch if there is work; otherwise check the KV invariant once (a leak is
        a bug and raises) and return nothing."""
        if not self.scheduler.has_work:
            if not self._idle_checked:
                self.scheduler.check_invariants()
                self._idle_checked = True
            return []
        self._idle_checked = False
        return self._outputs(self.scheduler.step())

    def stats(self) -> dict[str, Any]:
        return {**self.scheduler.stats(), "num_finished_reqs": self.num_finished}

    def flush_cache(self) -> bool:
        return self.scheduler.flush_cache()

    def end_program(self, program_id: str) -> int:
        return self.scheduler.end_program(program_id)

    def shutdown(self) -> None:
        self.scheduler.grammars.shutdown()
        self.scheduler.check_invariants()
        self.worker.shutdown()

    def _outputs(self, touched: list[Req]) -> list[RequestOutput]:
        """Streaming requests report their first token, then every ``--stream-interval`` new
        tokens (or the request's own ``stream_interval``), and their end; the others only their finished result."""
        outputs = []
        for req in touched:
            if not (req.options.stream or req.is_finished):
                continue
            start = self._reported.get(req.rid, 0)
            interval = req.params.stream_interval or self.stream_interval
            if not req.is_finished and start > 0 and len(req.output_ids) - start < interval:
                continue  # held for the next report
            outputs.append(RequestOutput(req, start, len(req.output_ids) - start, req.is_finished, req.error))
            if req.is_finished:
                self._reported.pop(req.rid, None)
                self.num_finished += 1
            else:
                self._reported[req.rid] = len(req.output_ids)
        return outputs
