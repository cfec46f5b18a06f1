"""``/tokenize`` and ``/detokenize`` (also under ``/v1``), as SGLang and vLLM serve them: an
agent counts what its context will cost before it sends it. A chat (``messages`` with
``tools``) is rendered exactly as the chat route renders it, so its count is the
``prompt_tokens`` that route would report. The answer carries both servers' names:
``tokens`` / ``count`` / ``max_model_len`` (and vLLM's ``token_strs`` when asked); on the way
back SGLang's ``text`` and vLLM's ``prompt``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from runtime.request_builder import check_token_ids
from runtime.server.chat_completion import ChatCompletion
from runtime.server.context import ServerContext, bad_input_as_400, read_body
from runtime.server.protocol import ApiError
from runtime.server.protocol_native import DetokenizeRequest, TokenizeRequest
from runtime.server.protocol_openai import ChatCompletionRequest
from runtime.server.responses import JsonResponse

CHAT_FIELDS = ("messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs",
               "add_special_tokens")


async def tokenize(ctx: ServerContext, req: TokenizeRequest, request: Request) -> dict[str, Any]:
    if req.model is not None:
        ctx.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise ApiError(400, "give either 'prompt' (text) or 'messages' (a chat)", param="prompt")
    if req.messages is not None:
        chat = ChatCompletionRequest.model_validate(
            {"model": ctx.model_name, **req.model_dump(include=set(CHAT_FIELDS), exclude_none=True)})
        handler = ChatCompletion(ctx, chat, request)
        handler.check_request()
        handler.exact_prompt = True
        ids = [await handler.prompt_ids()]
    else:
        texts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt or [])
        ids = await ctx.encode(texts, req.add_special_tokens is not False)
    one = not isinstance(req.prompt, list)
    out: dict[str, Any] = {"tokens": ids[0] if one else ids, "count": len(ids[0]) if one else [len(i) for i in ids],
                           "max_model_len": ctx.max_context_len}
    if req.return_token_strs:
        strs = [ctx.tokenizer.hf.convert_ids_to_tokens(i) for i in ids]
        out["token_strs"] = strs[0] if one else strs
    return out


def detokenize(ctx: ServerContext, req: DetokenizeRequest) -> dict[str, Any]:
    if req.model is not None:
        ctx.check_model(req.model)
    one = not (req.tokens and isinstance(req.tokens[0], list))
    lists: list[list[int]] = [req.tokens] if one else req.tokens  # type: ignore[list-item,assignment]
    with bad_input_as_400("tokens"):
        for ids in lists:
            check_token_ids(ids, ctx.limits.vocab_size, "tokens")
    texts = [ctx.tokenizer.decode(ids, req.skip_special_tokens) for ids in lists]
    text: str | list[str] = texts[0] if one else texts
    return {"text": text, "prompt": text}


def add_routes(app: FastAPI, ctx: ServerContext) -> None:
    for path in ("/tokenize", "/v1/tokenize"):
        @app.post(path)
        async def tokenize_route(request: Request) -> Response:
            req: TokenizeRequest = await read_body(request, TokenizeRequest, ctx.http.max_request_bytes)
            return JsonResponse(await tokenize(ctx, req, request))

    for path in ("/detokenize", "/v1/detokenize"):
        @app.post(path)
        async def detokenize_route(request: Request) -> Response:
            req: DetokenizeRequest = await read_body(request, DetokenizeRequest, ctx.http.max_request_bytes)
            return JsonResponse(detokenize(ctx, req))
