"""Request bodies of SGLang's native routes (``/generate``, ``/parse_function_call``,
``/separate_reasoning``, ``/abort_request``, ``/configure_logging``, ``/end_program``) and of
``/tokenize`` / ``/detokenize``."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from runtime.server.protocol import _Body
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
    log_metrics: bool = True
    no_logs: bool = False
    # accepted at their neutral value only
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    lora_path: Any = None
    lora_id: Any = None
    input_embeds: Any = None
    token_ids_logprob: Any = None
    session_params: Any = None
    custom_logit_processor: Any = None
    return_hidden_states: bool = False
    return_routed_experts: bool = False
    return_bytes: bool = False
    return_entropy: bool = False
    background: bool = False
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    data_parallel_rank: Any = None
    priority: Any = None
    routed_dp_rank: Any = None
    disagg_prefill_dp_rank: Any = None
    bootstrap_pair_key: Any = None
    decode_tp_size: Any = None
    modalities: Any = None
    images_config: Any = None
    video_config: Any = None
    mm_processor_kwargs: Any = None
    mm_hashes: Any = None
    mm_content_hashes: Any = None
    max_dynamic_patch: Any = None
    min_dynamic_patch: Any = None
    image_max_dynamic_patch: Any = None
    video_max_dynamic_patch: Any = None
    use_audio_in_video: bool = False
    positional_embed_overrides: Any = None
    need_wait_for_mm_inputs: Any = None
    num_items_assigned: Any = None
    encoder_urls: Any = None
    watermark: Any = None
    return_sampling_mask: bool = False
    sampling_logprobs_mode: Any = None
    return_flat_raw_top_logprobs: bool = False
    return_flat_raw_output_top_logprobs: bool = False
    return_flat_raw_top_logprobs_b64: bool = False
    return_indexer_topk: bool = False
    max_thinking_tokens: Any = None
    require_reasoning: bool = False
    multi_item_delimiter_indices: Any = None
    token_indices_to_pool: Any = None
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

    UNSUPPORTED: ClassVar[tuple[str, ...]] = (
        "image_data", "video_data", "audio_data", "lora_path", "lora_id", "input_embeds", "token_ids_logprob",
        "session_params", "custom_logit_processor", "return_hidden_states", "return_routed_experts", "return_bytes",
        "return_entropy", "background", "bootstrap_host", "bootstrap_port", "bootstrap_room", "data_parallel_rank",
        "priority", "routed_dp_rank", "disagg_prefill_dp_rank", "bootstrap_pair_key", "decode_tp_size", "modalities",
        "images_config", "video_config", "mm_processor_kwargs", "mm_hashes", "mm_content_hashes", "max_dynamic_patch",
        "min_dynamic_patch", "image_max_dynamic_patch", "video_max_dynamic_patch", "use_audio_in_video",
        "positional_embed_overrides", "need_wait_for_mm_inputs", "num_items_assigned", "encoder_urls", "watermark",
        "return_sampling_mask", "sampling_logprobs_mode", "return_flat_raw_top_logprobs",
        "return_flat_raw_output_top_logprobs", "return_flat_raw_top_logprobs_b64", "return_indexer_topk",
        "max_thinking_tokens", "require_reasoning", "multi_item_delimiter_indices", "token_indices_to_pool",
    )


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
    dump_requests_folder: str | None = None
    dump_requests_threshold: int | None = None
    dump_requests_exclude_meta_keys: list[str] | None = None
    crash_dump_folder: str | None = None

    UNSUPPORTED: ClassVar[tuple[str, ...]] = ("dump_requests_folder", "dump_requests_threshold",
                                              "dump_requests_exclude_meta_keys", "crash_dump_folder")


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
