"""Request bodies of SGLang's native routes (``/generate``, ``/parse_function_call``,
``/separate_reasoning``, ``/abort_request``, ``/configure_logging``, ``/end_program``) and of
``/tokenize`` / ``/detokenize``."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from runtime.server.protocol import NeutralOnly, _Body
from runtime.server.protocol_openai import ChatMessage, Tool


class GenerateReqInput(_Body):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    # one value for every prompt, or a list with one per prompt (SGLang's)
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] = -1
    top_logprobs_num: int | list[int] = 0
    return_text_in_logprobs: bool = False
    # one id (a batch or n > 1 runs as rid_0, rid_1, ...), or a list: one per prompt (each
    # expanded so for n > 1, as SGLang does) or one per request
    rid: str | list[str] | None = None
    # Requests with different keys never share cached prefixes (tenants, salts).
    extra_key: str | None = None
    cache_salt: str | None = None
    # Keep this request's prefix cached until POST /end_program with the same id.
    program_id: str | None = None
    # accepted and ignored: they change nothing here
    model: str | None = None
    priority: int | None = None  # SGLang without --enable-priority-scheduling ignores it too
    log_metrics: bool = True
    no_logs: bool = False
    # accepted at their neutral value only
    image_data: NeutralOnly[Any] = None
    video_data: NeutralOnly[Any] = None
    audio_data: NeutralOnly[Any] = None
    lora_path: NeutralOnly[Any] = None
    lora_id: NeutralOnly[Any] = None
    input_embeds: NeutralOnly[Any] = None
    token_ids_logprob: NeutralOnly[Any] = None
    session_params: NeutralOnly[Any] = None
    custom_logit_processor: NeutralOnly[Any] = None
    return_hidden_states: NeutralOnly[bool] = False
    return_routed_experts: NeutralOnly[bool] = False
    return_bytes: NeutralOnly[bool] = False
    return_entropy: NeutralOnly[bool] = False
    background: NeutralOnly[bool] = False
    bootstrap_host: NeutralOnly[Any] = None
    bootstrap_port: NeutralOnly[Any] = None
    bootstrap_room: NeutralOnly[Any] = None
    data_parallel_rank: NeutralOnly[int] = 0  # rank 0: the only rank a server of its own has
    routed_dp_rank: NeutralOnly[int] = 0  # rank 0: the only rank a server of its own has
    disagg_prefill_dp_rank: NeutralOnly[int] = 0  # rank 0: the only rank a server of its own has
    bootstrap_pair_key: NeutralOnly[Any] = None
    decode_tp_size: NeutralOnly[Any] = None
    modalities: NeutralOnly[Any] = None
    images_config: NeutralOnly[Any] = None
    video_config: NeutralOnly[Any] = None
    mm_processor_kwargs: NeutralOnly[Any] = None
    mm_hashes: NeutralOnly[Any] = None
    mm_content_hashes: NeutralOnly[Any] = None
    max_dynamic_patch: NeutralOnly[Any] = None
    min_dynamic_patch: NeutralOnly[Any] = None
    image_max_dynamic_patch: NeutralOnly[Any] = None
    video_max_dynamic_patch: NeutralOnly[Any] = None
    use_audio_in_video: NeutralOnly[bool] = False
    positional_embed_overrides: NeutralOnly[Any] = None
    need_wait_for_mm_inputs: NeutralOnly[Any] = None
    num_items_assigned: NeutralOnly[Any] = None
    encoder_urls: NeutralOnly[Any] = None
    watermark: NeutralOnly[Any] = None
    return_sampling_mask: NeutralOnly[bool] = False
    sampling_logprobs_mode: NeutralOnly[Any] = None
    return_flat_raw_top_logprobs: NeutralOnly[bool] = False
    return_flat_raw_output_top_logprobs: NeutralOnly[bool] = False
    return_flat_raw_top_logprobs_b64: NeutralOnly[bool] = False
    return_indexer_topk: NeutralOnly[bool] = False
    max_thinking_tokens: NeutralOnly[Any] = None
    require_reasoning: NeutralOnly[bool] = False
    multi_item_delimiter_indices: NeutralOnly[Any] = None
    token_indices_to_pool: NeutralOnly[Any] = None
    # SGLang's: each output also carries the prompt's token ids
    return_prompt_token_ids: bool = False
    # accepted and ignored: routing, tracing and metrics hints, SGLang's internal bookkeeping
    session_id: str | None = None
    routing_key: str | None = None
    conversation_id: str | None = None
    custom_labels: dict[str, Any] | None = None
    kv_hints: Any = None
    external_trace_header: Any = None
    http_worker_ipc: Any = None
    received_time: Any = None
    routed_experts_start_len: int = 0


class ParseFunctionCallReq(_Body):
    """SGLang's ``POST /parse_function_call``: the calls a model wrote in ``text``."""

    text: str
    tools: list[Tool] = Field(default_factory=list)  # OpenAI's function tools: for tool_index
    tool_call_parser: str | None = None  # unset: the chat route's


class SeparateReasoningReq(_Body):
    """SGLang's ``POST /separate_reasoning``: ``text``'s reasoning and answer."""

    text: str
    reasoning_parser: str
    return_blocks: bool = False


class EndProgramReq(_Body):
    program_id: str


class AbortRequestReq(_Body):
    """SGLang's ``POST /abort_request``: one request by its ``rid``, or all of them."""

    rid: str = ""
    abort_all: bool = False


class ConfigureLoggingReq(_Body):
    """SGLang's ``POST /configure_logging``: what to change (unset: keep)."""

    log_requests: bool | None = None
    log_requests_level: int | None = None
    log_requests_format: str | None = None
    log_level: str | None = None  # the HTTP and scheduler processes'
    # SGLang's request dumps: accepted when not set
    dump_requests_folder: NeutralOnly[str | None] = None
    dump_requests_threshold: NeutralOnly[int | None] = None
    dump_requests_exclude_meta_keys: NeutralOnly[list[str] | None] = None
    crash_dump_folder: NeutralOnly[str | None] = None


class TokenizeRequest(_Body):
    """``POST /tokenize``: SGLang's fields (``prompt``: one text or several) and vLLM's (also
    ``messages`` with ``tools``, rendered as the chat route renders them; ``return_token_strs``)."""

    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool | None = None  # unset: true for a prompt, false for a chat (as the chat route)
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    """``POST /detokenize``: one list of token ids or several."""

    model: str | None = None
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True
