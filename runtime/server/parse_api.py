"""SGLang's ``/parse_function_call`` and ``/separate_reasoning``: the chat route's tool-call
and reasoning parsers on a text a client already has (an RL pipeline that generated through
``/generate``, say), with SGLang's answer shapes."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from runtime.server.context import ServerContext, read_body
from runtime.server.protocol import ApiError
from runtime.server.protocol_native import ParseFunctionCallReq, SeparateReasoningReq
from runtime.server.reasoning import PARSERS as REASONING_PARSERS
from runtime.server.responses import JsonResponse
from runtime.server.tools.parsers import PARSERS as TOOL_PARSERS
from runtime.server.tools.parsers import ToolCallParser, get_parser
from runtime.server.tools.template import tool_template

_SGLANG_NAMES = {"llama3": "llama3_json"}  # SGLang's names for our parsers


def _tool_parser(ctx: ServerContext, name: str | None) -> ToolCallParser:
    """The parser named (SGLang's names too), or the chat route's: ``--tool-call-parser``,
    or the one its template implies."""
    name = _SGLANG_NAMES.get(name, name) if name else ctx.http.tool_call_parser
    if name != "auto" and name not in TOOL_PARSERS:
        raise ApiError(400, f"unknown tool_call_parser {name!r}; this server has {', '.join(TOOL_PARSERS)} "
                            "(and llama3 for llama3_json)", param="tool_call_parser")
    try:
        template = tool_template(ctx.tokenizer.hf, ctx.chat_template_override) if name == "auto" else None
    except ValueError as err:  # no template to infer the format from: the client has to name it
        raise ApiError(400, f"{err}; or name the format with tool_call_parser", param="tool_call_parser") from err
    return get_parser(name, template)


def parse_function_call(ctx: ServerContext, req: ParseFunctionCallReq) -> dict[str, Any]:
    normal_text, calls = _tool_parser(ctx, req.tool_call_parser).parse(req.text)
    names = [t.function.name if t.function is not None else None for t in req.tools]
    return {
        "normal_text": normal_text,
        "calls": [{"tool_index": names.index(c.name) if c.name in names else -1, "name": c.name,
                   "parameters": c.arguments} for c in calls],
    }


def separate_reasoning(req: SeparateReasoningReq) -> dict[str, Any]:
    parser = REASONING_PARSERS.get(req.reasoning_parser)
    if parser is None:
        raise ApiError(400, f"unknown reasoning_parser {req.reasoning_parser!r}; this server has "
                            f"{', '.join(REASONING_PARSERS)}", param="reasoning_parser")
    reasoning, text, _ = parser.split(req.text)
    out: dict[str, Any] = {"reasoning_text": reasoning, "text": text}
    if req.return_blocks:
        blocks = ([{"type": "reasoning", "text": reasoning}] if reasoning else []) + [{"type": "text", "text": text}]
        out.update(reasoning_blocks=[reasoning] if reasoning else [], text_blocks=[text], blocks=blocks)
    return out


def add_routes(app: FastAPI, ctx: ServerContext) -> None:
    @app.post("/parse_function_call")
    async def parse_function_call_route(request: Request) -> Response:
        req: ParseFunctionCallReq = await read_body(request, ParseFunctionCallReq, ctx.http.max_request_bytes)
        return JsonResponse(parse_function_call(ctx, req))

    @app.post("/separate_reasoning")
    async def separate_reasoning_route(request: Request) -> Response:
        req: SeparateReasoningReq = await read_body(request, SeparateReasoningReq, ctx.http.max_request_bytes)
        return JsonResponse(separate_reasoning(req))



