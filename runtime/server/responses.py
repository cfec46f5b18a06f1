"""What the HTTP handlers answer with: JSON and SSE framing, waiting on a group of requests
(aborting them if the client goes away), and the SGLang-shaped result of one request."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response

from runtime.output_format import logprob_meta
from runtime.server.context import in_api_words
from runtime.server.protocol import ApiError
from runtime.server.scheduler_client import ReqState, SchedulerClient
from runtime.tokenizer import Tokenizer


class JsonResponse(Response):
    """JSON via orjson (fast, and handles numpy scalars)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def error_of(state: ReqState, names: dict[str, str] | None = None) -> ApiError | None:
    """The request's failure as an API error, its field under the route's name for it
    (``names``: native -> route name, e.g. json_schema -> response_format)."""
    if state.error is None:
        return None
    param = (names or {}).get(state.error_param, state.error_param) if state.error_param else None
    return ApiError(state.error_status, in_api_words(state.error, names), param=param)


async def wait_all(client: SchedulerClient, states: list[ReqState], request: Request) -> list[ReqState]:
    """Wait for every state; abort all of them if the client goes away."""
    await client.wait_all(states, request.is_disconnected)
    return states


async def merged_updates(
    client: SchedulerClient, states: list[ReqState], is_disconnected: Callable[[], Awaitable[bool]] | None = None
) -> AsyncIterator[tuple[int, ReqState]]:
    """``(index, state)`` each time one of ``states`` changes, until all finish. Closing the
    iterator (client gone) aborts the unfinished ones."""
    async with contextlib.aclosing(client.merged(states, is_disconnected)) as changes:
        async for i in changes:
            yield i, states[i]


def native_output(state: ReqState, tokenizer: Tokenizer, text_in_logprobs: bool, logprobs_from: int = 0,
                  prompt_scored_by: ReqState | None = None) -> dict[str, Any]:
    """One request's result in SGLang's ``/generate`` shape. ``logprobs_from``: report only
    the output tokens' logprobs from there on, and the prompt's only when it is 0 (a stream's
    later events carry just what is new). ``prompt_scored_by``: the request whose prompt
    logprobs to report (another sample of the prompt, ``score_each_prompt_once``)."""
    scored = prompt_scored_by or state
    end = state.finished_at if state.is_finished else None
    meta: dict[str, Any] = {
        "id": state.rid,
        "finish_reason": state.finished_reason,
        "prompt_tokens": state.prompt_tokens,
        "completion_tokens": len(state.output_ids),
        "cached_tokens": state.cached_tokens,
    }
    if end is not None:
        meta["e2e_latency"] = end - state.created_at
    if state.return_logprob:
        meta.update(
            logprob_meta(
                scored.input_token_logprobs if logprobs_from == 0 else [],
                scored.input_top_logprobs if logprobs_from == 0 else [],
                state.output_token_logprobs[logprobs_from:],
                state.output_top_logprobs[logprobs_from:],
                tokenizer.id_to_text if text_in_logprobs else None,
                len(state.output_token_logprobs),
            )
        )
    return {"text": state.text, "output_ids": list(state.output_ids), "meta_info": meta}
