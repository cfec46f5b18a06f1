"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``,
``/v1/chat/completions/render`` (the prompt and constraint a chat request would run with) and
the Responses API (``/v1/responses``, and reading a stored response, its input items,
cancelling a background one, or deleting it; conversations in ``conversations_api.py``). The handlers live in ``completion.py``, ``chat_completion.py`` and
``responses_api.py`` (their shared part in ``openai_handler.py``)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from runtime.server import conversations_api
from runtime.server.chat_completion import ChatCompletion
from runtime.server.completion import Completion
from runtime.server.context import ServerContext, read_body
from runtime.server.protocol import ApiError
from runtime.server.protocol_openai import ChatCompletionRequest, CompletionRequest
from runtime.server.protocol_responses import ResponsesRequest
from runtime.server.response_store import ConversationStore, ResponseStore, open_tables
from runtime.server.responses import JsonResponse
from runtime.server.responses_api import ResponseCreation
from runtime.server.responses_background import BackgroundRuns
from runtime.server.responses_input import item_page


def add_routes(app: FastAPI, ctx: ServerContext) -> None:
    responses_table, conversations_table = open_tables(ctx.http.response_store)
    stored_responses = ResponseStore(table=responses_table)
    conversations = ConversationStore(table=conversations_table)
    background = BackgroundRuns(stored_responses)
    conversations_api.add_routes(app, conversations, ctx.http.max_request_bytes)

    def card(name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": int(ctx.started_at),
            "owned_by": "forkserve",
            "root": ctx.model_path,
            "max_model_len": ctx.max_context_len,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card(name) for name in (ctx.model_name, *ctx.other_model_names)]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        ctx.check_model(model, in_body=False)
        return card(model if model in ctx.other_model_names else ctx.model_name)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = await read_body(request, CompletionRequest, ctx.http.max_request_bytes)
        return await Completion(ctx, req, request).run()

    @app.post("/v1/chat/completions")
    @app.post("/invocations")  # SGLang's, for SageMaker: a chat completion
    async def chat_completions(request: Request) -> Response:
        req: ChatCompletionRequest = await read_body(request, ChatCompletionRequest, ctx.http.max_request_bytes)
        return await ChatCompletion(ctx, req, request).run()

    @app.post("/v1/chat/completions/render")
    async def render_chat_completion(request: Request) -> Response:
        req: ChatCompletionRequest = await read_body(request, ChatCompletionRequest, ctx.http.max_request_bytes)
        return await ChatCompletion(ctx, req, request).render()

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        req: ResponsesRequest = await read_body(request, ResponsesRequest, ctx.http.max_request_bytes)
        return await ResponseCreation(ctx, req, request, stored_responses, conversations).run(background)

    @app.post("/v1/responses/input_tokens")
    async def count_input_tokens(request: Request) -> Response:
        """OpenAI's: the tokens a response with this body would take as its prompt (its
        conversation, instructions and tools rendered as ``/v1/responses`` renders them)."""
        req: ResponsesRequest = await read_body(request, ResponsesRequest, ctx.http.max_request_bytes)
        req.stream, req.background, req.store = False, False, False
        handler = ResponseCreation(ctx, req, request, stored_responses, conversations, counting=True)
        handler.check_request()
        handler.exact_prompt = True
        ids = await handler.prompt_ids()
        return JsonResponse({"object": "response.input_tokens", "input_tokens": len(ids)})

    @app.post("/v1/responses/compact")
    async def compact_response() -> Response:
        # a 404 as for the other routes this server lacks (absent_routes.py), not the 405 the
        # GET /v1/responses/{response_id} route would give
        raise ApiError(404, "POST /v1/responses/compact is not supported by this server; with truncation: auto a "
                            "response drops the oldest turns that do not fit instead")

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, stream: bool = False, starting_after: int | None = None) -> Response:
        if stream:
            return background.stream(response_id, starting_after)
        return JsonResponse(background.response(response_id))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> Response:
        return JsonResponse(await background.cancel(response_id))

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(response_id: str, limit: int = 20, order: str = "desc", after: str | None = None) -> Response:
        return JsonResponse(item_page(stored_responses.input_items(response_id), limit, order, after))

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> Response:
        background.forget(response_id)
        stored_responses.delete(response_id)
        return JsonResponse({"id": response_id, "object": "response", "deleted": True})
