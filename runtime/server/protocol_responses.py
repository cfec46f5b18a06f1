"""Request bodies of OpenAI's Responses and Conversations APIs (``/v1/responses``,
``/v1/conversations``), with the same rules as ``protocol.py``'s: every field declared,
``null`` meaning "not given", what cannot be honoured a 400."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from runtime.server.protocol import NeutralOnly, _Body
from runtime.server.protocol_openai import SharedSampling


# ---------------------------------------------------------------- OpenAI Conversations API
class ConversationCreateRequest(_Body):
    items: list[dict[str, Any]] | None = Field(default=None, max_length=20)
    metadata: dict[str, str] | None = None


class ConversationUpdateRequest(_Body):
    metadata: dict[str, str] | None = None  # null or missing: no metadata


class ConversationItemsRequest(_Body):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=20)


# ---------------------------------------------------------------- OpenAI Responses API
class ResponseTextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")  # JSON Schema's true / false too
    strict: bool | None = None

    @model_validator(mode="after")
    def _json_schema_has_its_schema(self) -> ResponseTextFormat:
        """As OpenAI's: a ``json_schema`` format gives its ``schema`` (the chat route's
        ``response_format`` may leave it out: any JSON value)."""
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("a format of type json_schema needs its 'schema'")
        return self


# What ``include`` may ask for: OpenAI's values. Only the output text's logprobs change
# anything here; the others are about tools and inputs this server does not have.
Includable = Literal["file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
                     "message.input_image.image_url", "computer_call_output.output.image_url",
                     "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs"]


class ResponseText(_Body):
    format: ResponseTextFormat | None = None
    verbosity: str | None = None  # accepted and ignored


class ResponsesRequest(SharedSampling):
    """``POST /v1/responses``. ``input`` items and ``tools`` stay plain dicts here: each is
    checked as it is turned into a chat message or tool (``responses_api.py``), with a 400
    that names the item."""

    model: str | None = None  # unset: the served model (as SGLang and vLLM take it)
    input: str | list[dict[str, Any]] = Field(default_factory=list)  # may be left out after a conversation
    instructions: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # SGLang's, as on the chat route
    previous_response_id: str | None = Field(default=None, min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    text: ResponseText | None = None
    store: bool = True
    include: list[Includable] | None = None
    truncation: Literal["auto", "disabled"] | None = None  # auto: drop turns from the start to fit
    request_id: str | None = None  # accepted and ignored
    # accepted and ignored: they change nothing here
    metadata: dict[str, Any] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: Any = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None  # its effort as the chat route's reasoning_effort; summary ignored
    max_tool_calls: int | None = None
    access_programs: Any = None
    background_options: Any = None
    image: Any = None
    background: bool = False  # run on after the answer to this request (responses_background.py)
    conversation: str | dict[str, Any] | None = None  # its id, or {"id": ...}
    # accepted at their neutral value only
    prompt: NeutralOnly[Any] = None
    context_management: NeutralOnly[Any] = None
    moderation: NeutralOnly[Any] = None
    priority: NeutralOnly[int] = 0  # requests are served in arrival order
