"""The scheduler process: receive, schedule, run, send results — one loop around ``EngineCore``.

Requests arrive tokenized from the HTTP server process; token ids leave for the detokenizer. A request
that cannot run (too long, bad parameters) fails alone with an error update; an exception
inside a step is a bug and ends the process, so the HTTP server reports it and exits.
"""

from __future__ import annotations

import logging
import signal
import time
import traceback
from typing import Any

import numpy as np
import torch
import zmq

from runtime import ipc
from runtime.config import ServerArgs
from runtime.executor import compute_threads
from runtime.ipc.messages import (
    AbortReq,
    BatchTokenOut,
    ControlOut,
    ControlReq,
    ReadyOut,
    TokenizedGenerateReq,
    TokenUpdate,
)
from runtime.log_setup import configure_logging, set_log_level
from runtime.scheduler.activity_log import ActivityLog
from runtime.scheduler.core import EngineCore, RequestOutput
from runtime.scheduler.req import Req

logger = logging.getLogger("forkserve")

class SchedulerServer:
    """The multi-process driver of ``EngineCore``: requests in from the HTTP server process,
    outputs out to the detokenizer, a step whenever there is work."""

    def __init__(self, core: EngineCore, recv_sock: zmq.Socket, send_sock: zmq.Socket,
                 log_stats_interval: float = 10.0) -> None:
        self.core, self.log_stats_interval = core, log_stats_interval
        self.recv_sock = recv_sock
        self.send_sock = send_sock

    def loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.recv_sock, zmq.POLLIN)
        activity = ActivityLog(self.core, self.log_stats_interval)
        while True:
            if not self.core.has_work:
                self.core.step()  # idle: checks the KV invariant once
                activity.maybe_log()  # idle after work: its last line comes when its interval ends
                poller.poll(activity.idle_wait_ms())
            for msg in ipc.recv_all(self.recv_sock):
                self.handle(msg)
            if self.core.has_work:
                activity.step_starting()
                outputs = self.core.step()
                activity.record(outputs)
                self.send_updates(outputs)
                activity.maybe_log()

    # ------------------------------------------------------------------ input
    def handle(self, msg: Any) -> None:
        if isinstance(msg, list):  # the HTTP process sends a large group in chunks (runtime/server/outbox.py)
            aborted = []  # answered in one message, not one each
            for item in msg:
                if isinstance(item, AbortReq):
                    aborted += self.core.abort(item.rid, item.message)
                else:
                    self.handle(item)
            self.send_updates(aborted)
        elif isinstance(msg, TokenizedGenerateReq):
            self.add(msg)
        elif isinstance(msg, AbortReq):
            self.send_updates(self.core.abort(msg.rid, msg.message))
        elif isinstance(msg, ControlReq):
            ipc.send(self.send_sock, ControlOut(msg.call_id, self.control(msg.kind, msg.arg)))
        else:
            raise TypeError(f"scheduler got an unknown message {type(msg).__name__}")

    def add(self, msg: TokenizedGenerateReq) -> None:
        req = Req(msg.rid, msg.input_ids.tolist(), msg.params, msg.options, msg.group)
        try:
            self.core.add_request(req)
        except ValueError as err:
            self.send_updates([self.core.reject(req, err)])

    def control(self, kind: str, arg: Any = None) -> Any:
        if kind == "stats":
            return self.core.stats()
        if kind == "flush_cache":
            return self.core.flush_cache()
        if kind == "end_program":
            return self.core.end_program(arg)
        if kind == "log_level":  # POST /configure_logging: this process and the tensor-parallel ranks
            set_log_level(arg)
            if self.core.worker.peers is not None:
                self.core.worker.peers.set_log_level(arg)
            return True
        raise ValueError(f"unknown control call {kind!r}")

    # ------------------------------------------------------------------ output
    def send_updates(self, outputs: list[RequestOutput]) -> None:
        if outputs:
            updates = [_update(out) for out in outputs]
            ids = [t for out in outputs for t in out.new_ids]
            ipc.send(self.send_sock, BatchTokenOut(updates, np.asarray(ids, dtype=np.int32)))


def _update(out: RequestOutput) -> TokenUpdate:
    req, start, p = out.req, out.start, out.req.params
    update = TokenUpdate(
        rid=req.rid,
        num_new=out.num_new,
        finished_reason=req.finished_reason,
        prompt_tokens=len(req.input_ids),
        cached_tokens=req.cached_tokens,
        completion_tokens=len(req.output_ids),
        skip_special_tokens=p.skip_special_tokens,
        stop=tuple(p.stop),
        stop_regex=tuple(p.stop_regex),
        no_stop_trim=p.no_stop_trim,
        include_stop_str_in_output=p.include_stop_str_in_output,
        decode_context=req.decode_context,
        min_new_tokens=p.min_new_tokens,
        error=out.error,
        error_param=req.error_param,
    )
    if req.options.return_logprob:
        if start == 0:
            update.input_token_logprobs = list(req.input_token_logprobs)
            update.input_top_logprobs = list(req.input_top_logprobs)
            update.input_token_ranks = list(req.input_token_ranks)
        update.output_token_logprobs = req.output_token_logprobs[start:]
        update.output_top_logprobs = req.output_top_logprobs[start:]
    return update


def run_scheduler_process(args: ServerArgs, model_dir: str, recv_from: str, send_to: str, parent_pid: int) -> None:
    """Entry point of the scheduler process: load the model, report ready, serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    ipc.exit_with_parent(parent_pid, endpoints=[recv_from, send_to])  # the server is gone: do not linger as an orphan
    configure_logging("scheduler", args.log_level)
    ctx = zmq.Context()
    recv_sock = ipc.bind(ctx, zmq.PULL, recv_from)
    send_sock = ipc.connect(ctx, zmq.PUSH, send_to)
    try:
        from pathlib import Path

        from runtime.tokenizer import Tokenizer

        core = EngineCore(args, Path(model_dir), Tokenizer(Path(model_dir)))
    except Exception as err:  # report why, then exit: the server fails fast with the reason
        # A ValueError is a setting the model cannot take: its message says it all. Anything
        # else is unexpected, and the log gets its traceback.
        expected = isinstance(err, ValueError)
        ipc.send(send_sock, ReadyOut(error=str(err) if expected else f"{type(err).__name__}: {err}"))
        if not expected:
            logger.error("model load failed:\n%s", traceback.format_exc())
        time.sleep(0.2)  # let the message leave
        raise SystemExit(1) from err
    worker = core.worker
    if compute_threads.adapts(args, worker):
        worker.compute_threads = compute_threads.ComputeThreads(torch.get_num_threads(), compute_threads.available_cores())
    info = {
        "max_context_len": worker.max_context_len,
        "max_total_tokens": core.scheduler.allocator.capacity,
        "weight_bytes": worker.weight_bytes,
        "vocab_size": worker.model_config.vocab_size,
        "dtype": args.resolved_dtype,
        "device": args.resolved_device,
        "attention_backend": args.resolved_attention_backend,
        "attention_kernel": worker.attention,
        "num_threads": torch.get_num_threads() if args.resolved_device == "cpu" else None,
        "chunked_prefill_size": core.scheduler.chunk_tokens,
        "gemm": worker.gemm,
        "elementwise": worker.elementwise,
    }
    ipc.send(send_sock, ReadyOut(info=info))
    SchedulerServer(core, recv_sock, send_sock, args.log_stats_interval).loop()
