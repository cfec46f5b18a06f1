"""``/openapi.json`` with the request bodies documented. The routes read their bodies
themselves (to answer every error in OpenAI's shape), so FastAPI does not see the pydantic
models; this adds each route's model, and the models it refers to, to the schema."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from runtime.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EndProgramReq,
    GenerateReqInput,
)

BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/generate": GenerateReqInput,
    "/end_program": EndProgramReq,
}
_REF = "#/components/schemas/{model}"


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, model in BODIES.items():
                body = model.model_json_schema(ref_template=_REF, by_alias=True)
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
                for operation in schema["paths"].get(path, {}).values():
                    operation["requestBody"] = {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}},
                    }
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
