"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, and
``/v1/chat/completions/render`` (the prompt and constraint a chat request would run with).
The handlers live in ``completion.py`` and ``chat_completion.py`` (their shared part in
``openai_handler.py``)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from runtime.server.chat_completion import ChatCompletion
from runtime.server.completion import Completion
from runtime.server.context import ServerContext, read_body
from runtime.server.protocol import ChatCompletionRequest, CompletionRequest


def add_routes(app: FastAPI, ctx: ServerContext) -> None:
    def card() -> dict[str, Any]:
        return {
            "id": ctx.model_name,
            "object": "model",
            "created": int(ctx.started_at),
            "owned_by": "forkserve",
            "root": ctx.model_path,
            "max_model_len": ctx.max_context_len,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        ctx.check_model(model)
        return card()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = await read_body(request, CompletionRequest, ctx.http.max_request_bytes)
        return await Completion(ctx, req, request).run()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req: ChatCompletionRequest = await read_body(request, ChatCompletionRequest, ctx.http.max_request_bytes)
        return await ChatCompletion(ctx, req, request).run()

    @app.post("/v1/chat/completions/render")
    async def render_chat_completion(request: Request) -> Response:
        req: ChatCompletionRequest = await read_body(request, ChatCompletionRequest, ctx.http.max_request_bytes)
        return ChatCompletion(ctx, req, request).render()
