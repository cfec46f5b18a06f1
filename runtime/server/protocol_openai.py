"""Request bodies of OpenAI's chat completions and completions routes, with the extras
vLLM and SGLang take on them (``protocol.py`` says how fields are declared)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from runtime.server.protocol import ApiError, NeutralOnly, _Body


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Body):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")  # JSON Schema's true / false too
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]  # the last: SGLang's, refused
    json_schema: JsonSchemaFormat | None = None


class SharedSampling(_Body):
    """Sampling fields that completions, chat and the Responses API all take under these
    names: OpenAI's own on the first two, SGLang's extras on the third (``responses_input.py``
    passes them to the chat request as they are)."""

    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    # requests with different keys never share cached prefixes (SGLang)
    extra_key: str | None = None
    cache_salt: str | None = None


class StructuredOutputs(_Body):
    """vLLM's ``structured_outputs`` (what its clients send now in place of ``guided_*``)."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False  # accepted and ignored: there is one grammar engine here
    # accepted at their neutral value only
    structural_tag: NeutralOnly[Any] = None
    whitespace_pattern: NeutralOnly[str | None] = None
    disable_any_whitespace: NeutralOnly[bool] = False
    disable_additional_properties: NeutralOnly[bool] = False


class OpenAISampling(SharedSampling):
    """Fields shared by completions and chat: OpenAI's, then the extras of vLLM and SGLang
    (besides ``SharedSampling``'s)."""

    model: str | None = None  # unset: the served model (as SGLang and vLLM take it)
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None  # token id (a JSON key) -> a bias in [-100, 100]
    # accepted and ignored: they change nothing here
    user: str | None = None
    # extras (vLLM / SGLang names)
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    include_stop_str_in_output: bool = False  # vLLM's: the text ends with the stop string
    # constrained output: OpenAI's response_format, vLLM / SGLang's regex and ebnf, vLLM's guided_*
    response_format: ResponseFormat | None = None
    regex: str | None = None
    ebnf: str | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = None
    guided_decoding_backend: str | None = None  # accepted and ignored: there is one grammar engine here
    guided_whitespace_pattern: NeutralOnly[str | None] = None
    json_schema: str | dict[str, Any] | None = None  # SGLang's name on both routes
    structured_outputs: StructuredOutputs | None = None
    # SGLang's: the requests' ids, as on /generate (so /abort_request can end them)
    rid: str | list[str] | None = None
    # token ids in the answer (vLLM's return_token_ids; SGLang's are the chat route's own)
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False  # vLLM's: logprobs name tokens "token_id:N"
    return_cached_tokens_details: bool = False  # SGLang's: sglext.cached_tokens_details
    add_special_tokens: bool | None = None  # vLLM's: unset = true for completions, false for chat
    request_id: str | None = None  # vLLM's name for rid; the response's id too
    stream_interval: int | None = None  # streamed: tokens per chunk (None: --stream-interval)
    truncate_prompt_tokens: int | None = None  # vLLM's: keep the prompt's last N tokens (-1: the context's)
    truncation_side: Literal["left", "right"] | None = None  # which end truncate_prompt_tokens keeps: right = the start
    prompt_logprobs: int | bool | None = None  # vLLM's: each prompt token's logprob, rank and this many others (-1: all; true: 1)
    # accepted and ignored (SGLang's gateway sends it)
    return_text_in_logprobs: bool = False
    # accepted and ignored: routing, tracing and metrics hints, and options of features that
    # are refused here anyway (beam search, routed experts)
    session_id: str | None = None
    custom_labels: dict[str, Any] | None = None
    return_spec_tokens_details: bool = False
    length_penalty: float | None = None
    routed_experts_start_len: int = 0
    routed_experts_prompt_start: int = 0
    return_token_offsets: bool | None = None
    mm_payload: str | None = None
    return_mm_kwargs: bool | None = None
    # accepted at their neutral value only
    best_of: int | None = None
    lora_path: NeutralOnly[Any] = None
    session_params: NeutralOnly[Any] = None
    custom_logit_processor: NeutralOnly[Any] = None
    custom_params: NeutralOnly[Any] = None
    return_hidden_states: NeutralOnly[bool] = False
    return_routed_experts: NeutralOnly[bool] = False
    bootstrap_host: NeutralOnly[Any] = None
    bootstrap_port: NeutralOnly[Any] = None
    bootstrap_room: NeutralOnly[Any] = None
    data_parallel_rank: NeutralOnly[int] = 0  # rank 0: the only rank a server of its own has
    priority: NeutralOnly[int] = 0  # requests are served in arrival order
    structural_tag: NeutralOnly[Any] = None
    allowed_token_ids: NeutralOnly[Any] = None
    bad_words: NeutralOnly[Any] = None
    logits_processors: NeutralOnly[Any] = None
    use_beam_search: NeutralOnly[bool] = False
    routed_dp_rank: NeutralOnly[int] = 0  # rank 0: the only rank a server of its own has
    disagg_prefill_dp_rank: NeutralOnly[int] = 0  # rank 0: the only rank a server of its own has
    watermark: NeutralOnly[Any] = None
    watermarking: NeutralOnly[Any] = None
    images_config: NeutralOnly[Any] = None
    mm_processor_kwargs: NeutralOnly[Any] = None
    kv_transfer_params: NeutralOnly[Any] = None
    ec_transfer_params: NeutralOnly[Any] = None
    vllm_xargs: NeutralOnly[Any] = None
    repetition_detection: NeutralOnly[Any] = None
    logprob_token_ids: NeutralOnly[Any] = None
    thinking_token_budget: int | None = None  # -1 (no budget) too


class CompletionRequest(OpenAISampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: NeutralOnly[str | None] = None
    prompt_embeds: NeutralOnly[Any] = None


class TextPart(_Body):
    type: Literal["text"]
    text: str
    prompt_cache_breakpoint: Any = None  # accepted and ignored: every prefix is cached here


class ContentPart(_Body):
    """A message part that is not text (an image, audio, a file): refused with a 400."""

    type: str


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


FUNCTION_NAME = r"^[A-Za-z0-9_.-]{1,64}$"  # OpenAI's rule for a function's name


class FunctionDef(_Body):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: str = "function"  # (vLLM's and SGLang's default); another kind (OpenAI's "custom") is a 400 naming it
    function: FunctionDef | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart | ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None
    # an assistant turn's reasoning as --reasoning-parser returned it: passed to the chat
    # template, which shows it or not (reasoning models' templates show the turn in progress)
    reasoning_content: str | None = None
    # accepted and ignored: what clients echo back from earlier responses
    refusal: str | None = None
    annotations: Any = None
    audio: Any = None
    function_call: FunctionCall | None = None  # the deprecated form of tool_calls (legacy_functions.py)

    def as_template_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(self._part_text(p) for p in content)
        elif content is None and self.role == "assistant" and self.refusal:  # OpenAI's answer that refused
            content = self.refusal
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": content or ""}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning_content and self.role == "assistant":
            out["reasoning_content"] = self.reasoning_content
        return out

    def _part_text(self, part: TextPart | ContentPart) -> str:
        """A content part's text: a text part's, or an assistant's refusal part's (what it
        said when it refused); any other kind is a 400 (text only)."""
        if isinstance(part, TextPart):
            return part.text
        refusal = (part.model_extra or {}).get("refusal")
        if part.type == "refusal" and self.role == "assistant" and isinstance(refusal, str):
            return refusal
        raise ApiError(400, f"message content of type '{part.type}' is not supported (text only)", param="messages")


class ChatCompletionRequest(OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # chat template controls (vLLM / SGLang)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # accepted and ignored: they change nothing here
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    verbosity: str | None = None
    parallel_tool_calls: bool | None = None
    # SGLang's reasoning controls (--reasoning-parser): split it off; stream it as it comes
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    modalities: list[str] | None = None  # ["text"] only
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    # the deprecated form of tools / tool_choice (legacy_functions.py)
    functions: list[FunctionDef] | None = None
    function_call: Literal["none", "auto"] | dict[str, Any] | None = None
    # accepted at their neutral value only
    audio: NeutralOnly[Any] = None
    prediction: NeutralOnly[Any] = None
    web_search_options: NeutralOnly[Any] = None
    moderation: NeutralOnly[Any] = None
    # passed to the chat template, where the template reads it (a 400 where it does not)
    reasoning_effort: str | None = None
    # vLLM's: false drops the reasoning --reasoning-parser splits off
    include_reasoning: bool = True
    # SGLang's: these token ids are the prompt (the messages still give the tool grammar)
    input_ids: list[int] | None = None
    # what the answer carries besides the message: SGLang's per choice (not streamed), its
    # sglext ids (streamed in a last chunk), vLLM's rendered prompt
    return_prompt_token_ids: bool = False
    return_meta_info: bool = False
    return_input_ids_in_sglext: bool = False
    return_output_ids_in_sglext: bool = False
    return_prompt_text: bool = False
    # accepted and ignored: it only changes flags refused here
    return_flat_raw_top_logprobs_b64: bool = True
    # accepted at their neutral value only
    echo: NeutralOnly[bool] = False
    documents: NeutralOnly[Any] = None
    chat_template: NeutralOnly[Any] = None
    media_io_kwargs: NeutralOnly[Any] = None
    max_dynamic_patch: NeutralOnly[Any] = None
    min_dynamic_patch: NeutralOnly[Any] = None
    use_audio_in_video: NeutralOnly[bool] = False
    video_config: NeutralOnly[Any] = None
    task: NeutralOnly[Any] = None
    thinking: NeutralOnly[Any] = None
    return_sampling_mask: NeutralOnly[bool] = False
    sampling_logprobs_mode: NeutralOnly[Any] = None
    return_flat_raw_output_top_logprobs: NeutralOnly[bool] = False
