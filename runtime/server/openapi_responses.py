"""What every route answers, for ``/openapi.json``: status codes, content types and body
schemas, as data. The routes build their answers by hand (orjson, SSE), so FastAPI cannot
infer them; ``openapi.install`` puts these in place of its guesses."""

from __future__ import annotations

from typing import Any

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["integer", "string"],
                                                                 "description": "the HTTP status, or OpenAI's "
                                                                 "error code where it has one"}},
    }},
}
_OBJECT = {"type": "object"}
_TEXT = {"type": "string"}
# An SSE event: its data line's text, or (events with a name, as the Responses API's) the
# fields of the event.
_SSE = {"text/event-stream": {"schema": {"anyOf": [_TEXT, {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}}]}}}

USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {"prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
                   "total_tokens": {"type": "integer"},
                   "prompt_tokens_details": {"type": ["object", "null"],
                                             "properties": {"cached_tokens": {"type": "integer"}}}},
}
_FINISH = {"type": ["string", "null"]}
# what ended a choice: vLLM's stop_reason, SGLang's matched_stop (a stop string or a token id)
_STOP = {"stop_reason": {"type": ["string", "integer", "null"]}, "matched_stop": {"type": ["string", "integer", "null"]}}
def _completion(object_name: str, choice: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI completion object (chat or text) whose ``choices`` items are ``choice``."""
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {"id": {"type": "string"}, "object": {"const": object_name}, "created": {"type": "integer"},
                       "model": {"type": "string"}, "usage": USAGE, "choices": {"type": "array", "items": choice}},
    }


_LOGPROBS = {"type": ["object", "null"]}
CHAT_COMPLETION = _completion("chat.completion", {
    "type": "object", "required": ["index", "message", "finish_reason"],
    "properties": {
        "index": {"type": "integer"}, "finish_reason": _FINISH, "logprobs": _LOGPROBS, **_STOP,
        "message": {"type": "object", "required": ["role"], "properties": {
            "role": {"const": "assistant"}, "content": {"type": ["string", "null"]},
            "reasoning_content": {"type": ["string", "null"]},
            "tool_calls": {"type": ["array", "null"], "items": _OBJECT}}},
    },
})
COMPLETION = _completion("text_completion", {
    "type": "object", "required": ["index", "text", "finish_reason"],
    "properties": {"index": {"type": "integer"}, "text": {"type": "string"}, "finish_reason": _FINISH,
                   "logprobs": _LOGPROBS, **_STOP},
})
GENERATE_ONE = {
    "type": "object",
    "required": ["text", "output_ids", "meta_info"],
    "properties": {"text": {"type": "string"}, "output_ids": {"type": "array", "items": {"type": "integer"}},
                   "meta_info": {"type": "object", "required": ["id", "prompt_tokens", "completion_tokens"],
                                 "properties": {"id": {"type": "string"}, "prompt_tokens": {"type": "integer"},
                                                "completion_tokens": {"type": "integer"},
                                                "cached_tokens": {"type": "integer"}}}},
}
RENDERED_CHAT = {
    "type": "object", "required": ["text", "sampling_params", "tool_call_parser"],
    "properties": {"text": {"type": "string"}, "sampling_params": {"type": "object"},
                   "tool_call_parser": {"type": ["string", "null"]}},
}
MODEL_CARD = {
    "type": "object", "required": ["id", "object", "created", "owned_by"],
    "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                   "owned_by": {"type": "string"}, "root": {"type": "string"}, "max_model_len": {"type": "integer"}},
}


LOAD = {
    "type": "object", "required": ["dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"],
    "properties": {k: {"type": "integer"} for k in ("dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens")},
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


RESPONSE = {
    "type": "object", "required": ["id", "object", "created_at", "status", "model", "output", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "response"}, "created_at": {"type": "integer"},
        "status": {"enum": ["completed", "incomplete", "in_progress", "failed", "cancelled"]}, "model": {"type": "string"},
        "output": {"type": "array", "items": {"type": "object", "required": ["type", "id"],
                                              "properties": {"type": {"enum": ["message", "function_call", "reasoning"]}}}},
        "usage": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["input_tokens", "output_tokens", "total_tokens"]}]},
    },
}


def _errors(*codes: int) -> dict[str, Any]:
    what = {400: "Bad input: the message and `param` name the field", 401: "Missing or wrong API key",
            404: "Not found (e.g. a model this server does not serve)", 413: "Request body too large",
            503: "The server is starting, shutting down or its scheduler has failed"}
    return {str(c): {"description": what[c], "content": _json(ERROR)} for c in codes}


_GUARDED = (400, 401, 413, 503)  # what a route with a body can answer besides success
# path -> method -> {status: {"description", "content"?}}; the same for every method unless listed
RESPONSES: dict[str, dict[str, dict[str, Any]]] = {
    "/health": {"*": {"200": {"description": "Healthy (no body)"}, "503": {"description": "Not healthy (no body)"}}},
    "/health_generate": {"*": {"200": {"description": "One token went through every process, or the busy "
                                                        "scheduler ran a step meanwhile (no body)"},
                               "503": {"description": "It did not (no body)"}}},
    "/get_model_info": {"*": {"200": {"description": "The served model", "content": _json(_OBJECT)},
                              **_errors(401)}},
    "/get_server_info": {"*": {"200": {"description": "Flags, queues, KV pool figures, process ids",
                                       "content": _json(_OBJECT)}, **_errors(401, 503)}},
    "/get_load": {"*": {"200": {"description": "SGLang's load report: one entry (this server is one data-parallel rank)",
                                "content": _json({"type": "array", "items": LOAD})}, **_errors(401, 503)}},
    "/flush_cache": {"*": {"200": {"description": "Flushed", "content": {"text/plain": {"schema": _TEXT}}},
                           "400": {"description": "Not flushed: requests are queued or running",
                                   "content": {"text/plain": {"schema": _TEXT}}},
                           **_errors(401, 503)}},
    "/end_program": {"*": {"200": {"description": "Prefixes released",
                                   "content": _json({"type": "object", "required": ["released_nodes"],
                                                     "properties": {"released_nodes": {"type": "integer"}}})},
                           **_errors(*_GUARDED)}},
    "/abort_request": {"*": {"200": {"description": "Aborted (also when no request has that rid)"},
                             **_errors(*_GUARDED)}},
    "/configure_logging": {"*": {"200": {"description": "Changed (no body)"}, **_errors(*_GUARDED)}},
    "/metrics": {"*": {"200": {"description": "Prometheus text format",
                               "content": {"text/plain": {"schema": _TEXT}}}, **_errors(401, 503)}},
    "/generate": {"*": {"200": {"description": "One result, a list for a batch, or SSE events when streaming",
                                "content": {**_json({"oneOf": [GENERATE_ONE, {"type": "array", "items": GENERATE_ONE}]}),
                                            **_SSE}},
                        **_errors(*_GUARDED)}},
    "/v1/models": {"*": {"200": {"description": "The served model", "content": _json({
        "type": "object", "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL_CARD}}})},
        **_errors(401)}},
    "/v1/models/{model}": {"*": {"200": {"description": "The model", "content": _json(MODEL_CARD)}, **_errors(401, 404)}},
    "/v1/completions": {"*": {"200": {"description": "A completion, or SSE chunks when streaming",
                                      "content": {**_json(COMPLETION), **_SSE}}, **_errors(*_GUARDED, 404)}},
    "/v1/chat/completions": {"*": {"200": {"description": "A chat completion, or SSE chunks when streaming",
                                           "content": {**_json(CHAT_COMPLETION), **_SSE}},
                                   **_errors(*_GUARDED, 404)}},
    "/v1/chat/completions/render": {"*": {"200": {"description": "What the chat request would run with: its prompt, its "
                                                  "output constraint as /generate sampling fields, its tool-call parser",
                                                  "content": _json(RENDERED_CHAT)},
                                          **_errors(400, 401, 404, 413)}},
}
RESPONSES["/v1/responses"] = {"*": {"200": {"description": "A response (output items: message, function_call, reasoning), "
                                             "or the Responses streaming events",
                                             "content": {**_json(RESPONSE), **_SSE}},
                                     **_errors(*_GUARDED, 404)}}
RESPONSES["/v1/responses/{response_id}"] = {
    "get": {"200": {"description": "A stored response, or (stream=true) its events again",
                    "content": {**_json(RESPONSE), **_SSE}}, **_errors(400, 401, 404)},
    "delete": {"200": {"description": "Deleted", "content": _json({
        "type": "object", "required": ["id", "object", "deleted"],
        "properties": {"id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}}})},
        **_errors(401, 404)},
}
RESPONSES["/v1/responses/{response_id}/cancel"] = {"*": {
    "200": {"description": "The background response, cancelled", "content": _json(RESPONSE)}, **_errors(400, 401, 404)}}
RESPONSES["/v1/responses/{response_id}/input_items"] = {"*": {
    "200": {"description": "A page of the stored response's input items", "content": _json({
        "type": "object", "required": ["object", "data", "has_more"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {"type": "object"}},
                       "has_more": {"type": "boolean"}}})},
    **_errors(400, 401, 404)}}
for _v1 in ("", "/v1"):
    RESPONSES[f"{_v1}/tokenize"] = {"*": {"200": {"description": "Token ids and their count (lists of them for a list of prompts)", "content": _json({
        "type": "object", "required": ["tokens", "count", "max_model_len"],
        "properties": {"tokens": {"type": "array"}, "count": {"anyOf": [{"type": "integer"}, {"type": "array"}]},
                       "max_model_len": {"type": "integer"}, "token_strs": {"type": "array"}}})},
        **_errors(400, 401, 404, 413)}}
    RESPONSES[f"{_v1}/detokenize"] = {"*": {"200": {"description": "The text of the ids (as text and as prompt)", "content": _json({
        "type": "object", "required": ["text", "prompt"],
        "properties": {"text": {"anyOf": [{"type": "string"}, {"type": "array"}]},
                       "prompt": {"anyOf": [{"type": "string"}, {"type": "array"}]}}})},
        **_errors(400, 401, 404, 413)}}
CONVERSATION = {"type": "object", "required": ["id", "object", "created_at", "metadata"],
                "properties": {"id": {"type": "string"}, "object": {"const": "conversation"},
                               "created_at": {"type": "integer"}, "metadata": {"type": "object"}}}
ITEM_LIST = {"type": "object", "required": ["object", "data", "has_more"],
             "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {"type": "object"}},
                            "first_id": {"type": ["string", "null"]}, "last_id": {"type": ["string", "null"]},
                            "has_more": {"type": "boolean"}}}
RESPONSES["/v1/conversations"] = {"*": {"200": {"description": "The new conversation", "content": _json(CONVERSATION)},
                                        **_errors(400, 401, 413)}}
RESPONSES["/v1/conversations/{conversation_id}"] = {
    "get": {"200": {"description": "The conversation", "content": _json(CONVERSATION)}, **_errors(401, 404)},
    "post": {"200": {"description": "The conversation with its new metadata", "content": _json(CONVERSATION)},
             **_errors(400, 401, 404, 413)},
    "delete": {"200": {"description": "Deleted", "content": _json({
        "type": "object", "required": ["id", "object", "deleted"],
        "properties": {"id": {"type": "string"}, "object": {"const": "conversation.deleted"},
                       "deleted": {"const": True}}})}, **_errors(401, 404)},
}
RESPONSES["/v1/conversations/{conversation_id}/items"] = {
    "get": {"200": {"description": "A page of the conversation's items", "content": _json(ITEM_LIST)},
            **_errors(400, 401, 404)},
    "post": {"200": {"description": "The items added", "content": _json(ITEM_LIST)}, **_errors(400, 401, 404, 413)},
}
RESPONSES["/v1/conversations/{conversation_id}/items/{item_id}"] = {
    "get": {"200": {"description": "The item", "content": _json({"type": "object"})}, **_errors(401, 404)},
    "delete": {"200": {"description": "The conversation, without the item", "content": _json(CONVERSATION)},
               **_errors(401, 404)},
}
RESPONSES["/model_info"] = RESPONSES["/get_model_info"]  # SGLang's newer names for the same answers
RESPONSES["/server_info"] = RESPONSES["/get_server_info"]
RESPONSES["/ping"] = RESPONSES["/ready"] = RESPONSES["/health"]
RESPONSES["/invocations"] = RESPONSES["/v1/chat/completions"]
RESPONSES["/v1/responses/input_tokens"] = {"*": {
    "200": {"description": "The tokens the response's prompt would take", "content": _json({
        "type": "object", "required": ["object", "input_tokens"],
        "properties": {"object": {"const": "response.input_tokens"}, "input_tokens": {"type": "integer"}}})},
    **_errors(*_GUARDED, 404)}}
RESPONSES["/v1/responses/compact"] = {"*": {**_errors(401, 404)}}
RESPONSES["/parse_function_call"] = {"*": {
    "200": {"description": "The text besides the calls, and the calls (tool_index, name, parameters as JSON text)",
            "content": _json({"type": "object", "required": ["normal_text", "calls"]})},
    **_errors(400, 401, 413)}}
RESPONSES["/separate_reasoning"] = {"*": {
    "200": {"description": "The reasoning and the answer (with return_blocks, as blocks too)",
            "content": _json({"type": "object", "required": ["reasoning_text", "text"]})},
    **_errors(400, 401, 413)}}

