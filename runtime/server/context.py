"""What every HTTP handler starts from: the server's context (model info, limits, the
scheduler client), the input checks, the body parser, and the submission of a group of
requests. What they answer with is in ``responses.py``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from runtime.config import ServerArgs
from runtime.request_builder import GenerateRequest, PartOfPrompt, RequestLimits
from runtime.sampling.params import InvalidField, SamplingParams
from runtime.serve_args import HttpArgs
from runtime.server.protocol import ApiError
from runtime.server.request_ids import ArrivingRequests
from runtime.server.scheduler_client import ReqState, SchedulerClient, ServerUnavailable
from runtime.server.tools.template import load_chat_template
from runtime.tokenizer import Tokenizer

logger = logging.getLogger("forkserve")

# Below this many characters a request's text is tokenized inline (a thread hop costs more).
_INLINE_ENCODE_CHARS = 20_000


# The model SGLang's model gateway names in a request that named none (it fills the field in).
GATEWAY_UNNAMED_MODEL = "unknown"


@dataclass
class ServerContext:
    client: SchedulerClient
    tokenizer: Tokenizer
    args: ServerArgs
    http: HttpArgs
    model_name: str
    model_path: str
    info: dict[str, Any] = field(default_factory=dict)  # from the scheduler at startup
    other_model_names: tuple[str, ...] = ()  # --served-model-name's names after the first
    process_ids: dict[str, int] = field(default_factory=dict)
    role_markers: dict[str, Any] = field(default_factory=dict)  # the chat template, for the DSL
    is_ready: bool = False
    is_shutting_down: bool = False
    started_at: float = field(default_factory=time.time)
    arrivals: ArrivingRequests = field(default_factory=ArrivingRequests)
    # set when a stopping server answers what is still open with its 503 (the grace is over)
    grace_over: asyncio.Event = field(default_factory=asyncio.Event)

    def end_open_requests(self) -> None:
        """Shutting down, past the grace period: every open request gets a 503 now, and
        requests whose body is still arriving stop waiting for it (``read_body``)."""
        self.is_shutting_down = True
        self.grace_over.set()
        self.client.end_open_requests("The server is shutting down.", 503)

    @functools.cached_property
    def chat_template_override(self) -> str | None:
        """The text of ``--chat-template`` (a file or a shipped template), if one was given."""
        return load_chat_template(self.http.chat_template)

    @property
    def max_context_len(self) -> int:
        return int(self.info["max_context_len"])

    @property
    def max_total_tokens(self) -> int:
        return int(self.info["max_total_tokens"])

    @property
    def max_sequence_len(self) -> int:
        return self.limits.max_sequence_len

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(int(self.info["vocab_size"]), self.max_context_len, self.max_total_tokens,
                             self.args.allow_auto_truncate, self.args.max_logprobs)

    @property
    def is_healthy(self) -> bool:
        return self.is_ready and not self.is_shutting_down and self.client.failure is None

    # ------------------------------------------------------------------ checks
    def check_model(self, model: str | None, in_body: bool = True) -> None:
        """A 404 unless ``model`` names the served model (None: left out, the served one; so
        is ``"unknown"`` in a request body, which SGLang's model gateway puts in one that
        named none)."""
        names = (self.model_name, *self.other_model_names, self.model_path, *((GATEWAY_UNNAMED_MODEL,) if in_body else ()))
        if model is not None and model not in names:
            raise ApiError(404, f"The model '{model}' does not exist; this server serves '{self.model_name}'", param="model")

    def check_capacity(self, num_new: int) -> None:
        limit = self.http.max_queued_requests
        if limit is None:
            return
        most = self.args.max_running_requests + limit
        if num_new > most:  # never admitted, however long the client waits: no "retry shortly"
            raise ApiError(400, f"The request is {num_new} sequences (n times the prompts), more than this server "
                                f"admits at once ({self.args.max_running_requests} running + {limit} queued, "
                                "--max-running-requests and --max-queued-requests); send fewer.")
        if self.client.num_open_requests + num_new > most:
            raise ApiError(
                503,
                f"The server is at capacity ({self.client.num_open_requests} requests open, at most "
                f"{self.args.max_running_requests} running + {limit} queued); retry shortly.",
                headers={"Retry-After": "1"},
            )

    def check_available(self) -> None:
        if self.client.failure is not None:
            raise ApiError(500, f"The server cannot serve requests: {self.client.failure}")
        if self.is_shutting_down:
            raise ApiError(503, "The server is shutting down.")

    @functools.cached_property
    def longest_useful_text(self) -> int:
        """Characters past which any text has more tokens than the context holds: a token
        covers at most as many characters as its longest vocabulary entry (twice that, to be
        safe)."""
        longest = max(len(token) for token in self.tokenizer.hf.get_vocab())
        return 2 * longest * (self.max_context_len + 1)

    async def encode(self, texts: list[str], add_special_tokens: bool = True, *, for_generation: bool = False,
                     keep_end: bool = False) -> list[list[int]]:
        """Token ids of ``texts``. Long inputs are tokenized on a worker thread, so that the
        event loop keeps answering other clients meanwhile (a megabyte of text takes ~0.5 s).
        ``for_generation``: a text too long for the context whatever its tokens is cut to
        ``longest_useful_text`` characters first (its start, or with ``keep_end`` its end),
        still too long, so that a huge prompt costs no more than that to refuse or truncate
        (a 20 MB one took 1.7 GB to tokenize)."""
        cap = self.longest_useful_text if for_generation else None

        def encode_one(text: str) -> list[int]:
            if cap is None or len(text) <= cap:
                return self.tokenizer.encode(text, add_special_tokens)
            part = text[-cap:] if keep_end else text[:cap]
            return PartOfPrompt(self.tokenizer.encode(part, add_special_tokens), cap, keep_end)

        def encode_all() -> list[list[int]]:
            return [encode_one(t) for t in texts]

        if sum(len(t) for t in texts) < _INLINE_ENCODE_CHARS:
            return encode_all()
        return await asyncio.to_thread(encode_all)

    # ------------------------------------------------------------------ submission
    def submit_group(self, requests: list[GenerateRequest], ids: list[tuple[str, str]] | None,
                     request: Request) -> list[ReqState]:
        """Submit checked requests (``runtime/request_builder.py``) as one group: the server
        must be up, have room for all of them, and the ids (``request_ids``: each one's id and
        the id its client gave) must be free, before any is sent. An ``/abort_request`` that
        came while the HTTP ``request`` arrived ends them at once (``ArrivingRequests``)."""
        self.check_available()
        self.check_capacity(len(requests))
        rids = [rid for rid, _ in ids] if ids else [self.client.new_rid() for _ in requests]
        try:
            states = self.client.submit_many([(rid, r.input_ids, r.params, r.options)
                                              for rid, r in zip(rids, requests, strict=True)])
        except ServerUnavailable as err:
            raise ApiError(500, f"The server cannot serve requests: {err}") from err
        except ValueError as err:  # an id repeated or in use
            raise ApiError(400, str(err), param="rid") from err
        aborts = self.arrivals.submitted(request)
        for state, (_, given) in zip(states, ids or [(s.rid, None) for s in states], strict=True):
            state.client_rid = given
        if aborts:
            self.client.cancel_many([s for s in states if None in aborts or s.rid in aborts or s.client_rid in aborts],
                                    "aborted by /abort_request")
        return states

    def abort(self, rid: str | None, abort_all: bool) -> None:
        """SGLang's ``/abort_request``: end the requests the client sent as ``rid`` (or all of
        them), also those still on their way to the scheduler."""
        self.arrivals.abort(rid, abort_all)
        self.client.cancel_many([state for state in self.client.states.values()
                                 if abort_all or (rid and rid in (state.rid, state.client_rid))],
                                "aborted by /abort_request")


def in_api_words(message: str, names: dict[str, str] | None) -> str:
    """``message`` with each field it names (``names``: ours -> the API's) in the API's words;
    quoted text and paths (``#/defs/max_new_tokens``: the client's own values) stay as they are."""
    if not names:
        return message
    words = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    pattern = re.compile(rf"""'[^']*'|"[^"]*"|(?<![\w/#.$-])({words})(?![\w/.-])""")
    return pattern.sub(lambda m: names[m.group(1)] if m.group(1) else m.group(0), message)


@contextlib.contextmanager
def bad_input_as_400(param: str, names: dict[str, str] | None = None) -> Iterator[None]:
    """Bad input raised inside the block as a 400: an ``InvalidField`` names its field (as
    ``names`` maps our field names to the API's, e.g. the OpenAI API's ``max_tokens``), any
    other ``ValueError``/``TypeError`` names ``param``."""
    try:
        yield
    except InvalidField as err:
        raise ApiError(400, in_api_words(str(err), names), param=(names or {}).get(err.field, err.field)) from err
    except (ValueError, TypeError) as err:
        raise ApiError(400, str(err), param=param) from err


def sampling_params(d: dict[str, Any] | None, param: str = "sampling_params",
                    names: dict[str, str] | None = None) -> SamplingParams:
    """``SamplingParams.from_dict``, its errors as 400s (see ``bad_input_as_400``)."""
    with bad_input_as_400(param, names):
        return SamplingParams.from_dict(d)


async def _body_bytes(request: Request, max_bytes: int | None) -> bytes:
    raw = bytearray()
    try:
        async for chunk in request.stream():
            raw += chunk
            if max_bytes is not None and len(raw) > max_bytes:
                raise ApiError(413, f"The request body is over {max_bytes} bytes, the most this server accepts")
    except ClientDisconnect as err:  # nobody to answer; not a server error (no traceback in the log)
        raise ApiError(400, "The client closed the connection before sending the whole request body") from err
    return bytes(raw)


async def _body_unless_stopped(request: Request, max_bytes: int | None, ctx: ServerContext) -> bytes:
    """The body, or a 503 when the server stops while it is still arriving (else the
    handler would be cancelled at the end of the graceful shutdown: a 500 and a traceback)."""
    reading = asyncio.ensure_future(_body_bytes(request, max_bytes))
    reading.add_done_callback(lambda t: t.cancelled() or t.exception())  # never an unretrieved error
    stopped = asyncio.ensure_future(ctx.grace_over.wait())
    try:  # (~30 us a request for the two tasks)
        await asyncio.wait((reading, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not reading.done():
            reading.cancel()
    if not reading.done() or reading.cancelled():
        raise ApiError(503, "The server is shutting down.")
    return reading.result()


async def read_body(request: Request, model: type[BaseModel], max_bytes: int | None = None) -> Any:
    """Parse the JSON body into ``model``; a 400 naming the field otherwise, a 413 for a
    body over ``max_bytes`` (checked before reading when the client declares its length)."""
    ctx = getattr(request.app.state, "ctx", None)
    if ctx is not None:  # from here until its requests are submitted, an abort is kept for them
        ctx.arrivals.arrive(request)
    declared = request.headers.get("content-length")
    if max_bytes is not None and declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, f"The request body has {int(declared)} bytes; this server accepts at most {max_bytes}")
    raw = await _body_bytes(request, max_bytes) if ctx is None else await _body_unless_stopped(request, max_bytes, ctx)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise ApiError(400, f"The request body is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object")
    try:
        body = model.model_validate(data)
    except ValidationError as err:
        raise validation_400(err) from err
    warn_unknown_fields(request.url.path, body)
    return body


def validation_400(err: ValidationError | RequestValidationError) -> ApiError:
    """A body's validation error as a 400 naming its first field (and how many more there are)."""
    errors = err.errors()
    where = field_path(errors[0]["loc"])
    more = f" ({len(errors)} errors)" if len(errors) > 1 else ""
    return ApiError(400, f"{where}: {errors[0]['msg']}{more}", param=where)


def field_path(loc: Sequence[Any]) -> str:
    """A validation error's location as the client's field path, as OpenAI writes it:
    ``guided_json``, not pydantic's ``guided_json.str`` (the member of a union that was
    tried), nor ``body.x``; list positions in brackets (``messages[0].role``)."""
    parts = [x for x in loc if not _is_union_member(x)]
    if parts and parts[0] == "body" and len(parts) > 1:
        parts = parts[1:]
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _is_union_member(part: Any) -> bool:
    """pydantic names the union member it tried by its type: ``str``, ``dict[str,any]``,
    ``ResponseFormat``, ``function-after[...]``; request fields are lower-case names."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "none") or "[" in part or part[:1].isupper())


_warned_fields: set[tuple[str, str]] = set()


def warn_unknown_fields(route: str, body: BaseModel, prefix: str = "") -> None:
    """Fields no model declares are ignored; say so once per route and name (a nested
    object's by its path: ``structured_outputs.bogus``)."""
    for name in body.model_extra or {}:
        if (route, prefix + name) not in _warned_fields:
            _warned_fields.add((route, prefix + name))
            logger.warning("%s: ignoring unknown request field %r (logged once)", route, prefix + name)
    for name in type(body).model_fields:
        value = getattr(body, name, None)
        if isinstance(value, BaseModel):
            warn_unknown_fields(route, value, f"{prefix}{name}.")


def unknown_sampling_field_warner(route: str) -> Callable[[str], None]:
    """For ``parse_sampling_params``: a name inside ``sampling_params`` that no sampling
    parameter has is ignored like an unknown top-level field, with one warning per name."""

    def warn(name: str) -> None:
        if (route, f"sampling_params.{name}") not in _warned_fields:
            _warned_fields.add((route, f"sampling_params.{name}"))
            logger.warning("%s: ignoring unknown sampling parameter %r (logged once)", route, name)

    return warn
