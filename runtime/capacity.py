"""Capacity planning on paper: what one replica's KV pool holds, and how many replicas a
load needs, from the model's shape and the device's memory (``forkserve capacity``).

The figures are the server's own rules: a token's KV costs ``2 x layers x kv_heads x
head_dim x dtype bytes`` (``KVPool.bytes_per_slot``), the pool is ``--max-total-tokens`` or
what ``--kv-cache-memory`` GiB holds, and a program's context stays in the pool while the
program runs. A prefix shared by the programs on a replica (a system prompt) is stored
once there, which cache-aware routing preserves and round robin does not (each replica
stores it once, and a conversation's history ends up on several).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from runtime.config import ServerArgs, cpu_flags
from runtime.models.config import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(cfg: ModelConfig, dtype: str) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * DTYPE_BYTES[dtype]


def num_parameters(cfg: ModelConfig) -> int:
    """Parameters of a Llama-family model: embeddings, per layer the attention and MLP
    projections and two norms, the final norm, and the output head unless tied."""
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size + 2 * h
    if cfg.qkv_bias:
        layer += q + 2 * kv
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * h
    return cfg.vocab_size * h + cfg.num_layers * layer + h + head


@dataclass(frozen=True)
class Plan:
    kv_bytes_per_token: int
    weight_bytes: int
    pool_tokens: int
    context_tokens: int
    shared_prefix_tokens: int

    @property
    def pool_bytes(self) -> int:
        return self.pool_tokens * self.kv_bytes_per_token

    @property
    def programs_per_replica(self) -> int:
        """Programs whose whole context fits in the pool at once, the shared prefix once."""
        own = self.context_tokens - self.shared_prefix_tokens
        return max(0, (self.pool_tokens - self.shared_prefix_tokens) // own)

    def replicas_for(self, concurrent_programs: int) -> int | None:
        per = self.programs_per_replica
        return math.ceil(concurrent_programs / per) if per else None


def model_config(model_path: str | None) -> tuple[Path, ModelConfig]:
    """The model's folder and shape, from its config (a GGUF file is converted to a folder on
    first use, as serve does; later calls find it in the cache)."""
    from runtime.model_loader import resolve_model_path
    from runtime.model_loader.weights import load_hf_config

    folder = resolve_model_path(model_path)
    return folder, ModelConfig.from_hf(load_hf_config(folder))


def weight_bytes(cfg: ModelConfig, dtype: str, packed_on_cpu: bool = False) -> int:
    """The weights' bytes as a server holds them: parameters x dtype bytes, plus, where the
    ``cpu`` attention backend packs the linear weights (``packed_on_cpu``), a tied output
    layer's packed copy beside the embedding (``LlamaForCausalLM.pack_for_cpu``). Not
    counted, as it depends on the weights' values: on CPUs without AVX-512 in float32, the
    exact 4- and 8-bit blocks kept beside weights that hold GGUF Q4_1 / Q8_0 values
    (``kernels/cpu/linear_blocks.py``; the default model: 0.10 GiB more). A running server
    reports what it holds: ``weight_bytes`` in ``/get_server_info``."""
    tied_copy = cfg.vocab_size * cfg.hidden_size if packed_on_cpu and cfg.tie_word_embeddings else 0
    return (num_parameters(cfg) + tied_copy) * DTYPE_BYTES[dtype]


def packs_on_cpu(args: ServerArgs) -> bool:
    """Whether a server with ``args`` packs its linear weights for the CPU GEMMs."""
    return args.resolved_device == "cpu" and args.resolved_attention_backend == "cpu"


def keeps_weight_blocks(args: ServerArgs) -> bool:
    """Whether a server with ``args`` also keeps weights whose values are exact 4- or 8-bit
    blocks in that form: float32 on our AVX2 GEMM, CPUs with AVX2 and FMA but no AVX-512
    (kernels/cpu/packed_linear.py); how much depends on the weights' values."""
    flags = cpu_flags()
    return (packs_on_cpu(args) and args.resolved_dtype == "float32" and {"avx2", "fma"} <= flags
            and "avx512f" not in flags)


def pool_tokens(kv_per_token: int, max_total_tokens: int | None, kv_cache_memory_gib: float) -> int:
    """The server's rule (``ModelWorker._kv_tokens``)."""
    return max_total_tokens or int(kv_cache_memory_gib * 2**30 // kv_per_token)


def largest_pool(kv_per_token: int, weight_bytes: int, device_bytes: int, usable: float) -> int:
    """Tokens of KV that fit beside the weights in ``usable`` of the device's memory (the
    rest is left to activations, the runtime and, on a CPU, everything else)."""
    return max(0, int(device_bytes * usable) - weight_bytes) // kv_per_token


def meminfo_bytes(field: str) -> int | None:
    """A /proc/meminfo figure (``MemTotal``, ``MemAvailable``) in bytes; None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration, ValueError):
        return None


def available_memory_bytes() -> int | None:
    """Memory a new allocation can take now: /proc/meminfo's MemAvailable, or less inside a
    container whose cgroup (v2) caps memory; None off Linux."""
    available = meminfo_bytes("MemAvailable")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return available
    if limit == "max" or available is None:
        return available
    return min(available, int(limit) - used)
