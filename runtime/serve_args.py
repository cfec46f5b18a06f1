"""Flags of ``forkserve serve`` beyond the engine's ``ServerArgs``: the HTTP front
(``HttpArgs``) and data-parallel replicas behind SGLang's model gateway
(``DataParallelArgs``). Neither reaches the scheduler or the model worker."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from runtime.arg_fields import check_types, flag_field
from runtime.log_setup import LOG_LEVELS


@dataclass(frozen=True)
class HttpArgs:
    """Flags of ``forkserve serve`` only (the HTTP front); the engine's are in ``ServerArgs``."""

    host: str = flag_field("127.0.0.1", "Address to bind. The default serves this machine only; 0.0.0.0 serves all interfaces.")
    port: int = flag_field(30000, "HTTP port.")
    api_key: str | None = flag_field(
        None, "Require 'Authorization: Bearer <key>' on every endpoint except /health, /health_generate, /ping, "
        "/ready and /metrics (as SGLang's server). Default: no key."
    )
    served_model_name: tuple[str, ...] | None = flag_field(
        None, "Model name(s) in the OpenAI API: requests may name any of them and /v1/models lists them all; answers "
        "carry the first (as vLLM's). Default: the model folder's name, or SmolLM2-135M-Instruct."
    )
    max_queued_requests: int | None = flag_field(
        None,
        "Most requests allowed to wait beyond --max-running-requests; more get 503 with Retry-After. "
        "Default: no limit.",
    )
    startup_timeout: float = flag_field(600.0, "Seconds to wait for the model to load before giving up.")
    tool_call_parser: str = flag_field(
        "auto",
        "How the model writes tool calls, for the chat route's 'tools': hermes (<tool_call> JSON blocks), "
        "qwen25, llama3_json (SGLang's llama3), mistral, or auto (picked from the chat template; hermes for the template "
        "shipped for ChatML models that cannot show tools, such as the default model).",
        choices=["auto", "hermes", "qwen25", "llama3_json", "llama3", "mistral"],
    )
    reasoning_parser: str | None = flag_field(
        None,
        "Split a reasoning model's thinking from its answer on the chat route: text between its think "
        "markers goes to message.reasoning_content (and reasoning_content deltas). deepseek-r1 (the "
        "template opens the thinking; also qwen3-thinking, step3) or qwen3 (the model writes <think>).",
        choices=["deepseek-r1", "qwen3", "qwen3-thinking", "step3"],
    )
    chat_template: str | None = flag_field(
        None,
        "A Jinja chat template to use instead of the model's (for chats with and without tools): a file, or a "
        "shipped tool template by name: chatml_hermes_tools, llama3_json_tools or mistral_tools (what "
        "--tool-call-parser auto then reads: hermes, llama3_json, mistral).",
    )
    response_store: str | None = flag_field(
        None,
        "A SQLite file for the responses /v1/responses stores (for previous_response_id and GET "
        "/v1/responses/{id}) and the conversations of /v1/conversations: servers given the same file share them. --dp-size gives its replicas one file "
        "of its own unless this is set (the gateway may send a continuation to any replica). Default: in "
        "memory, this server only.",
    )
    stream_cumulative_logprobs: bool = flag_field(
        False,
        "On streamed /generate responses with return_logprob, repeat every logprob so far in each event "
        "(SGLang's form) instead of sending each token's logprobs once.",
    )
    max_request_bytes: int = flag_field(
        32 * 2**20,
        "Largest request body accepted, in bytes; a larger one gets 413 before it is parsed or tokenized.",
    )
    log_level_http: str = flag_field(
        "warning",
        "Log level of the HTTP server's own lines (uvicorn): info adds a line per HTTP request. Default "
        "warning (SGLang's default is its --log-level).",
        choices=list(LOG_LEVELS),
    )
    log_requests: bool = flag_field(
        False,
        "Log every generation request when it arrives and when it ends: id, token counts, finish reason, "
        "latency and, at the default --log-requests-level 2, the ends of its prompt and output text. POST "
        "/configure_logging changes this while serving.",
    )
    log_requests_level: int = flag_field(
        2,
        "What --log-requests shows: 0 ids, token counts, finish reason and timings; 1 also the sampling "
        "parameters; 2 also the prompt and output text, the first and last 1,000 characters of each; 3 all "
        "of the text.",
        choices=[0, 1, 2, 3],
    )
    log_requests_format: str = flag_field(
        "text",
        "--log-requests lines as text, or json (one object per line, for log collectors).",
        choices=["text", "json"],
    )

    def __post_init__(self) -> None:
        if isinstance(self.served_model_name, (str, list)):  # from Python: one name, or a list
            names = self.served_model_name
            object.__setattr__(self, "served_model_name", (names,) if isinstance(names, str) else tuple(names))
        check_types(self)
        if self.startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be positive, got {self.startup_timeout}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be positive, got {self.max_request_bytes}")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError("max_queued_requests must be >= 0")
        if self.api_key == "":  # "$KEY" of an unset variable: not "no key"
            raise ValueError("api_key is empty (leave it out for no key)")
        if self.served_model_name is not None and "" in self.served_model_name:
            raise ValueError("served_model_name is empty (leave it out for the default)")
        if self.tool_call_parser == "llama3":  # SGLang's name for the same format
            object.__setattr__(self, "tool_call_parser", "llama3_json")


ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two")


@dataclass(frozen=True)
class DataParallelArgs:
    """Flags of ``forkserve serve`` for data-parallel replicas behind SGLang's model gateway
    (``runtime/server/data_parallel.py``); the engine never sees them."""

    dp_size: int = flag_field(
        1,
        "Data-parallel replicas on this machine: N full servers, each with its own scheduler and worker "
        "processes, the CPU threads (--num-threads, default all cores) and the KV pool (--max-total-tokens or "
        "--kv-cache-memory) split evenly between them, on ports chosen automatically on 127.0.0.1, behind SGLang's "
        "model gateway listening on --host/--port. Needs the gateway: pip install sglang-router (from a checkout: pip install -e '.[router]'). "
        "1 serves one engine without a gateway.",
        aliases=["--dp", "--data-parallel-size"],
    )
    router_policy: str = flag_field(
        "cache_aware",
        "How the gateway picks a replica (--dp-size > 1): cache_aware (the replica whose past requests share "
        "the longest prefix with this one, if it shares more than the gateway's --cache-threshold of it; else "
        "the least loaded; the least loaded whenever the load is out of balance), round_robin (in turn), or "
        "power_of_two (the lighter of two random replicas, by the token load each reports on /get_load).",
        choices=list(ROUTER_POLICIES),
    )
    router_health_check_interval: int = flag_field(
        5,
        "Seconds between the gateway's health checks of each replica (GET /health_generate: a token through its "
        "scheduler, or a step seen while busy); after 2 failures in a row a replica is marked unhealthy and gets "
        "no more requests until it answers again.",
    )
    router_args: str = flag_field(
        "",
        "More flags for the gateway, as one string passed on (they override forkserve's choices), e.g. "
        "--router-args='--cache-threshold 0.5 --balance-abs-threshold 16'. "
        "All of them: python -m sglang_router.launch_router --help.",
    )

    def __post_init__(self) -> None:
        check_types(self)
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be at least 1, got {self.dp_size}")
        if self.router_health_check_interval < 1:
            raise ValueError(f"router_health_check_interval must be at least 1, got {self.router_health_check_interval}")
        try:
            shlex.split(self.router_args)
        except ValueError as err:
            raise ValueError(f"router_args cannot be split into flags: {err}") from err
