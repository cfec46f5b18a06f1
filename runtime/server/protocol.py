"""Request bodies of the HTTP API (pydantic) and the one error type handlers raise.

Unknown fields are rejected (as OpenAI's API does) so a misspelt parameter is a 400 naming
it, never silently ignored. Fields we know but do not implement are accepted only at their
neutral value and are otherwise a 400 that says they are not supported.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers
        self.type = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def reject_unsupported(req: BaseModel, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(req, name)
        if value not in (None, False, [], {}):
            raise ApiError(400, f"'{name}' is not supported by this server", param=name)


# ---------------------------------------------------------------- native (SGLang) API
class GenerateReqInput(_Strict):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = None
    # Requests with different keys never share cached prefixes (tenants, salts).
    extra_key: str | None = None
    cache_salt: str | None = None
    # Keep this request's prefix cached until POST /end_program with the same id.
    program_id: str | None = None
    # accepted at their neutral value only
    image_data: Any = None
    lora_path: Any = None
    input_embeds: Any = None
    token_ids_logprob: Any = None


class EndProgramReq(_Strict):
    program_id: str


# ---------------------------------------------------------------- OpenAI API
class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Strict):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _OpenAISampling(_Strict):
    """Fields shared by completions and chat, including the common non-OpenAI extras."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    user: str | None = None
    # extras (vLLM / SGLang names)
    top_k: int | None = None
    min_p: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    # constrained output: OpenAI's response_format, or vLLM / SGLang's regex and ebnf
    response_format: ResponseFormat | None = None
    regex: str | None = None
    ebnf: str | None = None
    # not supported unless neutral
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None


class CompletionRequest(_OpenAISampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def as_template_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class ChatCompletionRequest(_OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # not supported unless neutral
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
