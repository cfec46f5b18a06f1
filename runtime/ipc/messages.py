"""Messages between the server's processes: small typed dataclasses, one codec (``runtime.ipc``).

Flow (the HTTP process also tokenizes; the detokenizer passes ``ControlOut`` and ``ReadyOut``
on unchanged)::

    HTTP ──TokenizedGenerateReq / AbortReq / ControlReq──► scheduler
    scheduler ──BatchTokenOut / ControlOut / ReadyOut──► detokenizer
    detokenizer ──BatchStrOut / ControlOut / ReadyOut──► HTTP

Token ids travel as numpy arrays, which the codec sends as raw buffers.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from runtime.request_options import RequestOptions
from runtime.sampling.params import SamplingParams


@dataclass
class TokenizedGenerateReq:
    rid: str
    input_ids: np.ndarray  # int32
    params: SamplingParams
    options: RequestOptions
    group: str | None = None  # the wire id of its call's first request, when the call sent several


@dataclass
class AbortReq:
    rid: str
    message: str = "aborted by the client"  # the abort finish reason's message


@dataclass
class ControlReq:
    """A request/response call into the scheduler (``SchedulerServer.control``): ``kind`` is
    ``stats`` (the scheduler's figures), ``flush_cache`` (False while requests are queued or
    running), ``end_program`` (``arg``: the program id; how many pinned nodes it released) or
    ``log_level`` (``arg``: the level, set in the scheduler process and the tensor-parallel
    ranks)."""

    call_id: int
    kind: str
    arg: Any = None


@dataclass
class ControlOut:
    call_id: int
    result: Any


@dataclass
class ReadyOut:
    """Sent once by the scheduler when the model is loaded, or with ``error`` when it failed."""

    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class TokenUpdate:
    """New tokens of one request since the previous update (all of them for non-streaming)."""

    rid: str
    num_new: int  # this update's share of the batch's ``ids``
    finished_reason: dict[str, Any] | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    # only for the detokenizer's text rules
    skip_special_tokens: bool = True
    stop: tuple[str, ...] = ()
    stop_regex: tuple[str, ...] = ()
    no_stop_trim: bool = False
    min_new_tokens: int = 0  # where a stop string's match may have stopped the request
    include_stop_str_in_output: bool = False
    decode_context: tuple[int, ...] = ()  # the prompt's last tokens if it ends inside a character
    # logprob deltas as (logprob, token_id) pairs; top lists as lists of pairs
    input_token_logprobs: list[Any] | None = None
    input_top_logprobs: list[Any] | None = None
    input_token_ranks: list[int | None] | None = None
    output_token_logprobs: list[Any] | None = None
    output_top_logprobs: list[Any] | None = None
    error: str | None = None  # the request failed alone (set with an abort finish reason)
    error_param: str | None = None  # the request field the error is about

    # Pickled as the tuple of its field values, not a dict keyed by field name: one goes per
    # request per step across two process hops, and the tuple form decodes ~2x faster.
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (TokenUpdate, _token_update_values(self))


_token_update_values = operator.attrgetter(*(f.name for f in fields(TokenUpdate)))


def split_ids(ids: np.ndarray, updates: list[Any]) -> list[np.ndarray]:
    """Cut a batch's concatenated token ids into one array per update (views, by slicing:
    ``np.split`` costs ~4x as much for a step's few rows, on every hop of every step)."""
    out, start = [], 0
    for u in updates:
        end = start + (u.num_new if isinstance(u, TokenUpdate) else u.token.num_new)
        out.append(ids[start:end])
        start = end
    return out


@dataclass
class BatchTokenOut:
    updates: list[TokenUpdate]
    ids: np.ndarray  # int32, every update's new tokens, concatenated in order


@dataclass
class StrUpdate:
    """A ``TokenUpdate`` with its text: ``text`` is everything safe to show so far."""

    token: TokenUpdate
    text: str


@dataclass
class BatchStrOut:
    updates: list[StrUpdate]
    ids: np.ndarray  # as in BatchTokenOut
