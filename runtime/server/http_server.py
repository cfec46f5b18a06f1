"""The FastAPI app: SGLang's native API, health and introspection endpoints, and the
OpenAI routes from ``openai_api``. Handlers validate and tokenize, then hand the request
to the ``SchedulerClient``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from runtime.log_setup import LOG_LEVELS, set_log_level
from runtime.request_builder import (
    build_requests,
    one_per_prompt,
    parse_sampling_params,
    score_each_prompt_once,
)
from runtime.request_options import RequestOptions, cache_namespace
from runtime.server import openai_api, openapi, parse_api, tokenize_api
from runtime.server.absent_routes import absent_route_message
from runtime.server.context import (
    ServerContext,
    bad_input_as_400,
    read_body,
    sampling_params,
    unknown_sampling_field_warner,
    validation_400,
)
from runtime.server.protocol import ApiError, reject_unsupported
from runtime.server.protocol_native import (
    AbortRequestReq,
    ConfigureLoggingReq,
    EndProgramReq,
    GenerateReqInput,
)
from runtime.server.request_ids import request_ids
from runtime.server.responses import (
    SSE_DONE,
    JsonResponse,
    error_of,
    merged_updates,
    native_output,
    sse,
    wait_all,
)

# Open without --api-key's bearer, as on SGLang's server: health checks and Prometheus' scrape.
_OPEN_PATHS = ("/health", "/health_generate", "/metrics", "/ping", "/ready")
logger = logging.getLogger("forkserve")


class UnexpectedErrorAsJson:
    """ASGI middleware: an exception no handler turned into a response becomes a JSON 500
    (never a traceback in the body; the log has it). Starlette's own last-resort handler
    re-raises after answering, and the server then drops the client's keep-alive connection."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracking(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except Exception as err:
            if started:  # part of a response is out: nothing valid can follow it
                raise
            logger.exception("unexpected error in %s %s", scope.get("method"), scope.get("path"))
            response = JsonResponse(ApiError(500, f"internal error: {type(err).__name__}").body(), status_code=500)
            await response(scope, receive, send)


def create_app(ctx: ServerContext) -> FastAPI:
    async def check_api_key(request: Request) -> None:
        # A dependency, not a middleware: an HTTP middleware would hide client disconnects.
        key = ctx.http.api_key
        if key and request.url.path not in _OPEN_PATHS and request.headers.get("authorization") != f"Bearer {key}":
            raise ApiError(401, "Missing or invalid API key: send 'Authorization: Bearer <key>'")

    app = FastAPI(title="forkserve", default_response_class=JsonResponse, dependencies=[Depends(check_api_key)])
    app.state.ctx = ctx

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        return JsonResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
        return JsonResponse(validation_400(err).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        # Unknown routes (404) and methods (405) in the same shape as every other error; a
        # route another server has says what to use instead.
        message = str(err.detail)
        if err.status_code in (404, 405):
            message = absent_route_message(request.method, request.url.path) or message
        return JsonResponse(ApiError(err.status_code, message).body(), status_code=err.status_code,
                            headers=getattr(err, "headers", None))

    app.add_middleware(UnexpectedErrorAsJson)

    # ------------------------------------------------------------------ health and info
    @app.get("/health")
    @app.get("/ping")  # SGLang's, for SageMaker
    @app.get("/ready")  # SGLang's readiness probe: up and taking requests
    async def health() -> Response:
        return Response(status_code=200 if ctx.is_healthy else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        return Response(status_code=200 if await probe_generate(ctx) else 503)

    # SGLang renamed these two to /model_info and /server_info; its gateway asks for the new
    # names first and logs a deprecation warning for every worker that has only the old ones.
    @app.get("/get_model_info")
    @app.get("/model_info")
    async def get_model_info() -> dict[str, Any]:
        return {
            "model_path": ctx.model_path,
            "tokenizer_path": ctx.model_path,
            "served_model_name": ctx.model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "max_context_len": ctx.max_context_len,
            "chat_template_roles": ctx.role_markers,
        }

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info() -> dict[str, Any]:
        stats = await scheduler_call(ctx, "stats")
        accounted = stats["kv_free"] + stats["kv_evictable"] + stats["kv_protected"] + stats["kv_held_by_requests"]
        return {
            **dataclasses.asdict(ctx.args),
            **{k: v for k, v in dataclasses.asdict(ctx.http).items() if k != "api_key"},
            **ctx.info,
            # the folder actually served (the default model's too): a gateway loads its tokenizer from it
            "model_path": ctx.model_path,
            "served_model_name": ctx.model_name,
            "process_ids": ctx.process_ids,
            "scheduler": {**stats, "kv_invariant_holds": accounted == stats["kv_capacity"]},
            "version": _version(),
        }

    @app.get("/get_load")
    async def get_load() -> list[dict[str, int]]:
        return [load_report(await scheduler_call(ctx, "stats"))]

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if await scheduler_call(ctx, "flush_cache"):
            return PlainTextResponse("Cache flushed.\n")
        return PlainTextResponse("Cache not flushed: requests are queued or running.\n", status_code=400)

    @app.post("/configure_logging")
    async def configure_logging(request: Request) -> Response:
        req: ConfigureLoggingReq = await read_body(request, ConfigureLoggingReq, ctx.http.max_request_bytes)
        reject_unsupported(req)
        checks = (("log_requests_level", (0, 1, 2, 3)), ("log_requests_format", ("text", "json")),
                  ("log_level", LOG_LEVELS))
        for name, allowed in checks:
            if getattr(req, name) is not None and getattr(req, name) not in allowed:
                raise ApiError(400, f"{name} must be one of {', '.join(map(str, allowed))}, got {getattr(req, name)!r}",
                               param=name)
        if req.log_level is not None:
            await scheduler_call(ctx, "log_level", req.log_level)
            set_log_level(req.log_level)
        ctx.client.request_log.configure(req.log_requests, req.log_requests_level, req.log_requests_format)
        return Response(status_code=200)

    @app.post("/end_program")
    async def end_program(request: Request) -> dict[str, Any]:
        req: EndProgramReq = await read_body(request, EndProgramReq, ctx.http.max_request_bytes)
        return {"released_nodes": await scheduler_call(ctx, "end_program", req.program_id)}

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        req: AbortRequestReq = await read_body(request, AbortRequestReq, ctx.http.max_request_bytes)
        ctx.abort(req.rid, req.abort_all)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        stats = await scheduler_call(ctx, "stats")
        text = ctx.client.metrics.render(stats, ctx.model_name)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    # ------------------------------------------------------------------ native generate
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        req: GenerateReqInput = await read_body(request, GenerateReqInput, ctx.http.max_request_bytes)
        return await handle_generate(ctx, req, request)

    openai_api.add_routes(app, ctx)
    tokenize_api.add_routes(app, ctx)
    parse_api.add_routes(app, ctx)
    openapi.install(app)
    return app


async def scheduler_call(ctx: ServerContext, kind: str, arg: Any = None) -> Any:
    ctx.check_available()
    try:
        return await ctx.client.call(kind, arg)
    except asyncio.TimeoutError as err:
        raise ApiError(503, f"the scheduler did not answer '{kind}' in time") from err
    except Exception as err:
        raise ApiError(500, f"the scheduler is unavailable: {err}") from err


async def probe_generate(ctx: ServerContext, timeout: float = 20.0, poll: float = 0.5) -> bool:
    """Whether the pipeline (scheduler, model, detokenizer) makes progress within ``timeout``:
    a probe of one token comes back, or, while requests wait in a busy server's queue (the
    probe among them), the scheduler has run a forward step since it was sent (its ``stats``
    answer, which passes through the detokenizer, says so). A loaded server is healthy, not
    failing (SGLang answers so too, from any output after the probe); the probe left queued
    is aborted. An idle server's probe must come back itself (the check before "ready")."""
    if not ctx.is_ready or ctx.client.failure is not None or ctx.is_shutting_down:
        return False
    deadline = time.monotonic() + timeout

    async def forward_steps() -> int | None:
        """The scheduler's forward steps so far while requests wait; -1 when none wait; None
        when it does not answer in time (or the server failed)."""
        try:
            stats = await ctx.client.call("stats", timeout=max(0.0, deadline - time.monotonic()))
        except Exception:
            return None
        return stats["num_forward_steps"] if stats["num_waiting_reqs"] else -1

    before = await forward_steps()
    if before is None:
        return False
    ids = ctx.tokenizer.encode("ping") or [0]
    state = ctx.client.submit(f"health-{ctx.client.new_rid()}", ids, sampling_params({"max_new_tokens": 1}), log=False)
    waiting = asyncio.ensure_future(ctx.client.wait(state))
    try:
        while time.monotonic() < deadline:
            done, _ = await asyncio.wait({waiting}, timeout=min(poll, max(0.0, deadline - time.monotonic())))
            if done:
                return waiting.exception() is None and state.error is None
            steps = await forward_steps()
            if steps is None:
                return False
            if steps > before >= 0:  # waiting before and now, and a step ran in between
                return True
            before = steps if before < 0 else before
        return False
    finally:
        waiting.cancel()  # aborts the probe if it has not finished


def load_report(stats: dict[str, Any]) -> dict[str, int]:
    """SGLang's ``/get_load`` entry for one data-parallel rank (a forkserve server is one):
    requests running or waiting, and the tokens they occupy: KV slots held by requests or
    locked for them plus the waiting requests' tokens. SGLang's model gateway sums
    ``num_tokens`` over the list as the worker's load (power_of_two policy, ``/get_loads``)."""
    return {
        "dp_rank": 0,
        "num_reqs": stats["num_running_reqs"] + stats["num_waiting_reqs"],
        "num_waiting_reqs": stats["num_waiting_reqs"],
        "num_tokens": stats["kv_held_by_requests"] + stats["kv_protected"] + stats["num_waiting_tokens"],
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("forkserve")
    except PackageNotFoundError:
        return "unknown"


async def handle_generate(ctx: ServerContext, req: GenerateReqInput, request: Request) -> Response:
    reject_unsupported(req)
    if (req.text is None) == (req.input_ids is None):
        raise ApiError(400, "give exactly one of 'text' or 'input_ids'", param="text")
    if req.text is not None:
        is_batch = isinstance(req.text, list)
        texts = req.text if is_batch else [req.text]
        if not texts:
            raise ApiError(400, "'text' is an empty list", param="text")
        prompts = await ctx.encode(texts, for_generation=True)
    else:
        is_batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
        prompts = req.input_ids if is_batch else [req.input_ids]  # type: ignore[list-item]
    namespace = cache_namespace(req.extra_key, req.cache_salt)
    with bad_input_as_400("sampling_params"):
        options = [RequestOptions(req.stream, *logprob_options, namespace, req.program_id)  # type: ignore[arg-type]
                   for logprob_options in zip(*(one_per_prompt(getattr(req, name), name, len(prompts))
                                                for name in _LOGPROB_FIELDS), strict=True)]
        params = parse_sampling_params(req.sampling_params, len(prompts), unknown_sampling_field_warner("/generate"))
        requests = build_requests(prompts, params, options, ctx.limits,
                                  prompt_field="text" if req.text is not None else "input_ids")
    is_batch = is_batch or len(requests) > 1
    requests, prompt_source = score_each_prompt_once(requests, each_own=bool(req.stream) or req.rid is not None)
    states = ctx.submit_group(requests, request_ids(req.rid, [p.n for p in params]), request)

    def render(i: int, logprobs_from: int = 0) -> dict[str, Any]:
        """Request ``i``'s output, with the prompt logprobs of the sample that scored its prompt."""
        out = native_output(states[i], ctx.tokenizer, req.return_text_in_logprobs, logprobs_from,
                            prompt_scored_by=states[prompt_source[i]])
        if req.return_prompt_token_ids:  # SGLang's: in every output, every event too
            out["prompt_token_ids"] = list(requests[i].input_ids)
        return out

    if not req.stream:
        await wait_all(ctx.client, states, request)
        for s in states:
            err = error_of(s)
            if err is not None:
                raise err

        def answer() -> JsonResponse:
            outs = [render(i) for i in range(len(states))]
            return JsonResponse(outs if is_batch else outs[0])

        # A large batch's answer is built on a thread, so that other clients are served meanwhile.
        return answer() if len(states) < _ANSWER_INLINE else await asyncio.to_thread(answer)

    # Each event carries the logprobs of its new tokens only (the prompt's in the first),
    # unless --stream-cumulative-logprobs asks for SGLang's everything-so-far form.
    sent_logprobs = [0] * len(states)

    async def events() -> AsyncIterator[bytes]:
        async with contextlib.aclosing(merged_updates(ctx.client, states)) as updates:
            async for i, state in updates:
                err = error_of(state)
                if err is not None:
                    yield sse(err.body())
                    continue
                out = render(i, 0 if ctx.http.stream_cumulative_logprobs else sent_logprobs[i])
                sent_logprobs[i] = len(state.output_token_logprobs)
                if is_batch:
                    out["index"] = i
                yield sse(out)
        yield SSE_DONE

    return StreamingResponse(events(), media_type="text/event-stream")


_LOGPROB_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num")
_ANSWER_INLINE = 1000  # outputs; more are rendered on a thread (100k took ~0.5 s)
