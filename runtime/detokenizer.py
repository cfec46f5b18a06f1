"""The detokenizer process: token ids in, text out, off the scheduler's hot path.

Streaming text is decoded incrementally (``IncrementalText``: only the last few tokens are
re-decoded per update) and held back while it is incomplete: a partial UTF-8 character, or
a tail that could be the start of a stop string. The finished text is decoded once in full with the
same rule the offline engine uses (``Tokenizer.output_text``), so the two always agree.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from runtime import ipc
from runtime.incremental_text import IncrementalText
from runtime.ipc.messages import BatchStrOut, BatchTokenOut, StrUpdate, TokenUpdate, split_ids
from runtime.log_setup import configure_logging
from runtime.sampling import stop_regex
from runtime.tokenizer import Tokenizer


def visible_text(text: str, stop: tuple[str, ...], regexes: tuple[str, ...] = ()) -> str:
    """``text`` without a tail that may still grow into a stop string or a stop regex match."""
    held = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:k]):
                held = k
                break
    end = len(text) - held
    if regexes:
        end = min(end, stop_regex.held_from(regexes, text))
    return text[:end]


def shown_text(text: str, params: Any) -> str:
    """What a stream shows of ``text`` (a request's output so far): all of it with
    ``no_stop_trim``, else without a tail that may still become a stop. ``params``: the
    request's ``SamplingParams`` or a ``TokenUpdate`` (both carry the fields read here)."""
    return text if params.no_stop_trim else visible_text(text, tuple(params.stop), tuple(params.stop_regex))


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalText] = {}

    def process(self, batch: BatchTokenOut) -> BatchStrOut:
        out = []
        for update, new_ids in zip(batch.updates, split_ids(batch.ids, batch.updates), strict=True):
            out.append(StrUpdate(update, self.text_of(update, new_ids)))
        return BatchStrOut(out, batch.ids)

    def text_of(self, u: TokenUpdate, new_ids: np.ndarray) -> str:
        state = self.states.get(u.rid)
        if u.finished_reason is not None:
            ids = (state.ids if state else []) + new_ids.tolist()
            self.states.pop(u.rid, None)
            if u.error is not None:
                return ""
            return self.tokenizer.output_text(ids, u.finished_reason, u, u.decode_context)
        if state is None:
            state = self.states[u.rid] = IncrementalText(context=u.decode_context)
        state.feed(lambda ids: self.tokenizer.decode(ids, u.skip_special_tokens), new_ids.tolist())
        return shown_text(state.text, u)


def run_detokenizer_process(model_dir: str, recv_from: str, send_to: str, parent_pid: int, log_level: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    ipc.exit_with_parent(parent_pid, endpoints=[recv_from, send_to])  # the server is gone: do not linger as an orphan
    configure_logging("detokenizer", log_level)
    ctx = zmq.Context()
    recv_sock = ipc.bind(ctx, zmq.PULL, recv_from)
    send_sock = ipc.connect(ctx, zmq.PUSH, send_to)
    detok = Detokenizer(Tokenizer(Path(model_dir)))
    while True:
        msg = ipc.recv(recv_sock)
        ipc.send(send_sock, detok.process(msg) if isinstance(msg, BatchTokenOut) else msg)
