"""``/openapi.json`` with the request bodies and the answers documented. The routes read
their bodies themselves (to answer every error in OpenAI's shape), so FastAPI does not see
the pydantic models; this adds each route's model, and the models it refers to, to the
schema, narrows the fields a route accepts only at their neutral value to that value, and
puts each route's status codes, content types and answer schemas
(``openapi_responses.py``) in place of FastAPI's guesses."""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from runtime.server.openapi_responses import RESPONSES
from runtime.server.protocol import _Body
from runtime.server.protocol_native import (
    AbortRequestReq,
    ConfigureLoggingReq,
    DetokenizeRequest,
    EndProgramReq,
    GenerateReqInput,
    ParseFunctionCallReq,
    SeparateReasoningReq,
    TokenizeRequest,
)
from runtime.server.protocol_openai import ChatCompletionRequest, CompletionRequest
from runtime.server.protocol_responses import (
    ConversationCreateRequest,
    ConversationItemsRequest,
    ConversationUpdateRequest,
    ResponsesRequest,
)

BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/chat/completions/render": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/responses/input_tokens": ResponsesRequest,
    "/invocations": ChatCompletionRequest,
    "/generate": GenerateReqInput,
    "/end_program": EndProgramReq,
    "/abort_request": AbortRequestReq,
    "/configure_logging": ConfigureLoggingReq,
    "/parse_function_call": ParseFunctionCallReq,
    "/separate_reasoning": SeparateReasoningReq,
    "/v1/conversations": ConversationCreateRequest,
    "/v1/conversations/{conversation_id}": ConversationUpdateRequest,
    "/v1/conversations/{conversation_id}/items": ConversationItemsRequest,
    **{f"{v1}/tokenize": TokenizeRequest for v1 in ("", "/v1")},
    **{f"{v1}/detokenize": DetokenizeRequest for v1 in ("", "/v1")},
}
_REF = "#/components/schemas/{model}"


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, model in BODIES.items():
                body = model.model_json_schema(ref_template=_REF, by_alias=True)
                nested = body.pop("$defs", {})
                refusing = _bodies_refusing_values()
                components.update({name: _narrowed(refusing[name], part) if name in refusing else part
                                   for name, part in nested.items()})
                components[model.__name__] = _narrowed(model, body)
                for method, operation in schema["paths"].get(path, {}).items():
                    if method not in ("post", "put"):
                        continue
                    operation["requestBody"] = {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}},
                    }
            for path, operations in schema["paths"].items():
                for method, operation in operations.items():
                    answers = RESPONSES[path]
                    operation["responses"] = copy.deepcopy(answers.get(method, answers.get("*")))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# What "not given" may look like for a field accepted only at its neutral value.
_NEUTRAL = {"anyOf": [{"type": "null"}, {"const": False}, {"type": "array", "maxItems": 0},
                      {"type": "object", "maxProperties": 0}]}


def _bodies_refusing_values() -> dict[str, type[_Body]]:
    """Every request body (nested ones too, such as ``structured_outputs``) with a
    ``NeutralOnly`` field, by its schema name."""
    found: dict[str, type[_Body]] = {}
    todo = list(_Body.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.UNSUPPORTED:
            found[cls.__name__] = cls
    return found


def _narrowed(model: type[BaseModel], body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with each field the route refuses unless neutral (``UNSUPPORTED``) allowed only
    its neutral values, and ``/generate``'s rule that a request has ``text`` or ``input_ids``."""
    props = body.get("properties", {})
    for name in getattr(model, "UNSUPPORTED", ()):
        if name in props:
            default = model.model_fields[name].default
            neutral = _NEUTRAL if default in (None, False) else {"anyOf": [*_NEUTRAL["anyOf"], {"const": default}]}
            props[name] = {**neutral, "description": "not supported: only its neutral value is accepted"}
    if model is GenerateReqInput:
        body["anyOf"] = [{"required": ["text"]}, {"required": ["input_ids"]}]
    return body
