"""The model worker: owns the weights, the K/V tensors and the attention backend; runs one
forward per step and samples. It never decides which KV slots to use; the batch says."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from kernels.attention import check_backend_can_run, create_attention_backend
from kernels.attention.base import AttentionShape
from kernels.attention.forward_context import ForwardContext, forward_context
from kernels.cpu import attention_choice, gemm_choice
from kernels.cpu.elementwise import argmax_rows
from kernels.cpu.linear_blocks import FORMS as BLOCK_FORMS
from kernels.cpu.packed_linear import PackedLinearUnavailable, PackedWeight
from kernels.cpu.paged_attention import (
    AMX_SHARED_MIN_KEYS,
    AMX_SHARED_MIN_ROWS,
    grouping_min_keys,
    use_amx_grouping_thresholds,
)
from kernels.triton import triton_installed
from radix_cache import ReqToTokenTable
from runtime.capacity import available_memory_bytes
from runtime.config import MIN_KV_TOKENS, ServerArgs
from runtime.distributed import NO_TP, TPInfo, split_range
from runtime.executor.compute_threads import ComputeThreads
from runtime.executor.cuda_graph_runner import CudaGraphRunner
from runtime.executor.device_req_to_token import DeviceReqToToken
from runtime.executor.kv_pool import KVPool
from runtime.executor.model_input import ForwardInput, ModelInput, PromptLogprobs
from runtime.layers import (
    enable_fused_elementwise,
    pack_linear_weights,
    packed_weights,
    resident_weight_bytes,
)
from runtime.model_loader.load_model import load_model
from runtime.models.cpu_decoder_layers import CpuDecoderLayers
from runtime.process_memory import c_library
from runtime.sampling.sampler import sample, torch_argmax

logger = logging.getLogger("forkserve")

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class BatchResult:
    next_ids: list[int | None]
    output_logprobs: list[float | None]
    output_top_logprobs: list[list[tuple[float, int]] | None]
    # per request: (logprob, token id) of prompt tokens covered this step, and their top-k
    input_logprobs: list[list[tuple[float | None, int]]] = field(default_factory=list)
    input_top_logprobs: list[list[list[tuple[float, int]] | None]] = field(default_factory=list)
    # and each such token's rank (1 = the most likely; None for the unscored first one)
    input_ranks: list[list[int | None]] = field(default_factory=list)
    # per request that checked a draft (``ModelInput.draft_lens``): the greedy pick at each of
    # its last 1 + draft positions (``next_ids`` holds the first); empty: no request did
    draft_picks: list[list[int] | None] = field(default_factory=list)


class RankPeers(Protocol):
    """Rank 0's handle on tensor-parallel ranks 1..N-1 (``runtime/executor/tp_worker.py``: ``TPPeers``)."""

    tp: TPInfo

    def send_step(self, fwd: ForwardInput, table: torch.Tensor) -> None: ...

    def set_log_level(self, level: str) -> None: ...

    def stop(self) -> None: ...


def prepare_process(args: ServerArgs) -> None:
    """Set this process up for a worker and refuse, before anything loads or any rank starts,
    a device or attention backend that cannot run here (``ValueError``)."""
    device = args.resolved_device
    threads = args.num_threads or (max(1, (os.cpu_count() or 1) // args.tp_size) if args.tp_size > 1 else None)
    if threads:
        torch.set_num_threads(threads)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for, but torch {torch.__version__} finds no CUDA device")
    if device == "cpu":
        _keep_freed_memory_in_process()
    backend = args.resolved_attention_backend  # looks for a C++ compiler on PATH: once
    check_backend_can_run(backend, device)
    if device == "cpu" and args.attention_backend is None and backend == "torch_native":
        logger.warning("no C++ compiler on PATH: attention uses torch_native, which copies K/V each "
                       "step; install g++ (or set CXX) to get the compiled cpu backend")


class ModelWorker:
    """One rank of the model (rank 0 unless ``tp`` says otherwise), in a process set up by
    ``prepare_process``. With ``--tp-size N``, rank 0 gets ``peers`` (ranks 1..N-1, started by
    ``runtime/executor/tp_worker.py``) and sends each step's batch to them before its own forward;
    all ranks then run the same layers on their slices and meet in the all-reduces."""

    def __init__(
        self, args: ServerArgs, model_dir: Path, eos_token_ids: tuple[int, ...] = (), tp: TPInfo | None = None,
        peers: RankPeers | None = None,
    ) -> None:
        self.args = args
        self.device = args.resolved_device
        self.dtype = TORCH_DTYPES[args.resolved_dtype]
        backend = args.resolved_attention_backend
        self.peers = peers
        self.tp = (peers.tp if peers is not None else tp) or NO_TP
        self.model, self.model_config = load_model(model_dir, self.dtype, self.device, self.tp)
        # EOS ids: the tokenizer's and generation config's (passed in) and the model config's.
        self.eos_token_ids = tuple(sorted(set(eos_token_ids) | set(self.model_config.eos_token_ids)))
        self.max_context_len = self._context_len()
        self.num_slots = self._kv_tokens() + 1  # plus the reserved padding slot 0
        # Rows for running requests plus headroom for requests admitted in the same step.
        self.req_to_token = ReqToTokenTable(args.max_running_requests + 8, self.max_context_len)
        cfg = self.model_config
        local_kv_heads = split_range(cfg.num_kv_heads, self.tp.size, self.tp.rank)[1]
        shape = AttentionShape(local_kv_heads * (cfg.num_heads // cfg.num_kv_heads), local_kv_heads, cfg.head_dim)
        self.attn_backend = create_attention_backend(backend, self.device, shape)
        self.argmax, self.gemm = self._cpu_kernels() if backend == "cpu" else (torch_argmax, "F.linear")
        self.elementwise = self._cuda_elementwise() if self._on_cuda else ""
        # What the weights hold in memory as served (packed forms and blocks included).
        self.weight_bytes = resident_weight_bytes(self.model)
        # The bf16 extend attention's multiply-adds, measured on this machine (words for the log).
        widened = backend == "cpu" and self.dtype == torch.bfloat16 and attention_choice.choose_for(
            shape.num_heads, shape.num_kv_heads, shape.head_dim)
        self.attention = "extends on float32 FMAs" if widened else ""
        self.kv_pool = KVPool(
            self.num_slots, cfg.num_layers, local_kv_heads, cfg.head_dim, self.dtype, self.device,
            layout=self.attn_backend.kv_layout,
        )
        if backend == "cpu":
            try:
                self.model.compiled_layers = CpuDecoderLayers(self.model, self.kv_pool)
            except ValueError as exc:  # says why: dtype, packing, TP, layout or a shape
                logger.info("decoder layers run as PyTorch modules: %s", exc)
        # On CUDA the kernels read the batch's table rows from a device mirror; on CPU the
        # scheduler's own table is read directly.
        self.device_table = DeviceReqToToken(self.req_to_token.table, self.device) if self._on_cuda else None
        self.graph_runner = self._build_graph_runner(cfg.hidden_size)
        # Fewer compute threads while other processes keep cores busy: set by the server's
        # scheduler process where that applies (compute_threads.adapts); run() asks it.
        self.compute_threads: ComputeThreads | None = None
        self.default_generator = torch.Generator().manual_seed(args.random_seed)
        # Off the CPU, a step whose requests all sample plainly greedily picks its tokens on
        # the device and copies back only their ids (not [batch, vocab] float32 logits).
        self.greedy_on_device = torch.device(self.device).type != "cpu"

    def _context_len(self) -> int:
        """``--max-context-len``, at most (and by default) the model's position limit."""
        limit = self.model_config.max_position_embeddings
        context_len = self.args.max_context_len or limit
        if context_len > limit:
            raise ValueError(f"max_context_len {context_len} exceeds the model's max_position_embeddings {limit}")
        return context_len

    def _kv_tokens(self) -> int:
        """Tokens the KV pool holds: ``--max-total-tokens``, or what ``--kv-cache-memory`` fits.
        Sized by the whole model's KV heads, so every TP rank has the same slots."""
        cfg, args = self.model_config, self.args
        per_slot = KVPool.bytes_per_slot(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.dtype)
        num_tokens = args.max_total_tokens or int(args.kv_cache_memory * 2**30 // per_slot)
        if num_tokens < MIN_KV_TOKENS:
            raise ValueError(
                f"kv_cache_memory {args.kv_cache_memory:g} GiB holds {num_tokens} tokens of this model's KV "
                f"cache ({per_slot} bytes each); at least {MIN_KV_TOKENS} are needed"
            )
        # This process's part of the pool (a tensor-parallel rank holds its KV heads' share).
        local = num_tokens * per_slot * split_range(cfg.num_kv_heads, self.tp.size, self.tp.rank)[1] // cfg.num_kv_heads
        available = available_memory_bytes() if self.device.startswith("cpu") else None
        if available is not None and local > available:  # else the allocation fails, or swaps
            given = "max_total_tokens" if args.max_total_tokens else "kv_cache_memory"
            raise ValueError(
                f"{given} asks for a KV pool of {local / 2**30:.1f} GiB, more than the "
                f"{available / 2**30:.1f} GiB of memory available now ('forkserve capacity' prints what fits)"
            )
        return num_tokens

    def _cpu_kernels(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], str]:
        """The ``cpu`` backend's compiled elementwise kernels and packed linear weights (the
        same library); returns the argmax to sample greedy rows with, and the GEMM in words."""
        from kernels.cpu import elementwise

        enable_fused_elementwise(self.model, elementwise)
        if self.dtype == torch.float32:
            logger.debug("decode forks attend their shared keys together from %d keys (float32 K/V)",
                        grouping_min_keys(torch.float32))
        try:
            pack_linear_weights(self.model, self.dtype)
        except PackedLinearUnavailable as err:
            logger.warning("linear layers use plain F.linear (slower): %s", err)
        return argmax_rows, self._choose_gemm()

    def _cuda_elementwise(self) -> str:
        """On CUDA, RMSNorm, rotary and SiLU-and-mul as one Triton kernel each (a small
        model's decode step is otherwise a thousand tiny launches); says which, in words."""
        if self.args.disable_fused_elementwise:
            return "norms, rotary and SiLU as PyTorch ops (--disable-fused-elementwise)"
        if not triton_installed():
            logger.warning("triton is not installed: norms, rotary and SiLU run as chains of PyTorch ops (slower)")
            return "norms, rotary and SiLU as PyTorch ops (no triton)"
        from kernels.triton import elementwise

        enable_fused_elementwise(self.model, elementwise)
        return "fused Triton norms, rotary and SiLU"

    def _choose_gemm(self) -> str:
        """Which kernel multiplies the packed weights, in words; for bf16 weights on our GEMM,
        the widened-kernel and AMX row thresholds and the small-row prefetch measured on this machine
        (``kernels/cpu/gemm_choice.py``)."""
        weights = packed_weights(self.model)
        if not weights:
            return "F.linear"
        if not any(p.kind == "bf16_panels" for p in weights):
            if weights[0].kind != "f32_panels":
                return "oneDNN GEMM on packed weights"
            return "float32 GEMM of our own on packed weights (AVX2 FMAs)" + _block_forms_in_words(weights)
        bf16 = [(p.data, p.in_features, p.out_features) for p in weights if p.kind == "bf16_panels"]
        shapes = {(p.in_features, p.out_features) for p in weights}
        widen_rows = gemm_choice.choose_widen_for(shapes)
        rows = gemm_choice.choose_for(shapes)
        if rows >= gemm_choice.NEVER and gemm_choice.amx_available():
            logger.warning("this CPU has AMX tiles, but the measured GEMM choice keeps every product on the vector "
                           "kernel (prefill ~10x slower); another process probably took a core while it was "
                           "measured: delete %s to measure again", gemm_choice.cache_file_name())
        prefetch = rows > 1 and gemm_choice.choose_small_prefetch(bf16)
        if rows < gemm_choice.NEVER:  # GEMMs on AMX tiles: attention is more of a decode step
            use_amx_grouping_thresholds()
            logger.debug("decode forks attend their shared keys together on AMX tiles from %d query rows and %d keys",
                        AMX_SHARED_MIN_ROWS, AMX_SHARED_MIN_KEYS)
        return gemm_choice.describe(rows, prefetch, widen_rows)

    @property
    def _on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def _build_graph_runner(self, hidden_size: int) -> CudaGraphRunner | None:
        """Decode CUDA graphs: on CUDA, at TP=1 (ranks would have to replay in lockstep),
        with a backend that supports them, unless ``--disable-cuda-graph``."""
        args = self.args
        if not self._on_cuda or args.disable_cuda_graph or self.tp.size > 1:
            return None
        if not self.attn_backend.supports_cuda_graph:
            return None
        assert self.device_table is not None
        max_bs = min(args.resolved_cuda_graph_max_bs, self.req_to_token.max_requests)
        return CudaGraphRunner(
            self.model, self.attn_backend, self.kv_pool, self.device_table, max_bs, hidden_size, self.dtype
        )

    @torch.inference_mode()
    def run(self, inp: ModelInput) -> BatchResult:
        """One step: the forward, then sampling and logprobs where ``inp`` asks for them."""
        if self.compute_threads is not None:
            self.compute_threads.update()
        if self.greedy_on_device and plain_greedy(inp):
            return self._greedy_ids(inp, self.argmax(self.device_logits(inp)).tolist())
        return self._postprocess(inp, self.forward(inp))

    @torch.inference_mode()
    def forward(self, inp: ModelInput) -> torch.Tensor:
        """Float32 logits at each request's logit range, concatenated in batch order, on the host."""
        return self.device_logits(inp).cpu()

    def device_logits(self, inp: ModelInput) -> torch.Tensor:
        """The same, where the model computed them."""
        fwd = inp.forward
        if self.peers is not None:
            self.peers.send_step(fwd, self.req_to_token.table)
        hidden = self.run_model(fwd)
        if fwd.is_decode:  # every token is the last of its request
            return self.model.compute_logits(hidden)
        picks, offset = [], 0
        for prefix, ext, start in zip(fwd.prefix_lens, fwd.extend_lens, inp.logit_starts, strict=True):
            picks.append(torch.arange(offset + start - prefix, offset + ext))
            offset += ext
        return self.model.compute_logits(hidden[torch.cat(picks).to(self.device)])

    def run_model(self, fwd: ForwardInput) -> torch.Tensor:
        """The model's hidden states for one step (every TP rank runs this)."""
        table = self.req_to_token.table
        if self.device_table is not None:
            seq_lens = [p + e for p, e in zip(fwd.prefix_lens, fwd.extend_lens, strict=True)]
            self.device_table.sync(fwd.rows, max(seq_lens, default=0))
            table = self.device_table.table
        if fwd.is_decode and self.graph_runner is not None and self.graph_runner.can_run(len(fwd.extend_lens)):
            return self.graph_runner.replay(fwd.rows, fwd.prefix_lens, fwd.out_cache_loc, fwd.input_ids, fwd.positions)
        ctx = ForwardContext(
            is_decode=fwd.is_decode,
            req_rows=fwd.rows,
            prefix_lens=fwd.prefix_lens,
            extend_lens=fwd.extend_lens,
            out_cache_loc=fwd.out_cache_loc.to(self.device),
            req_to_token=table,
            kv_pool=self.kv_pool,
            attn_backend=self.attn_backend,
        )
        with forward_context(ctx):
            return self.model(fwd.input_ids.to(self.device), fwd.positions.to(self.device))

    def shutdown(self) -> None:
        """Stop the tensor-parallel peers and let go of the weights and the KV pool, so that
        an offline ``Engine`` shut down but still referenced holds no memory (1.4 GB for the
        default model); the worker is unusable after."""
        if self.peers is not None:
            self.peers.stop()
            self.peers = None
        self.model = self.kv_pool = self.graph_runner = self.attn_backend = self.device_table = None  # type: ignore[assignment]

    @staticmethod
    def _greedy_ids(inp: ModelInput, ids: list[int]) -> BatchResult:
        """The result of a ``plain_greedy`` step whose sampling requests picked ``ids``."""
        bs = inp.batch_size
        picked = iter(ids)
        next_ids = [None if row is None else next(picked) for row in inp.sampling]
        return BatchResult(next_ids, [None] * bs, [None] * bs, [[] for _ in range(bs)], [[] for _ in range(bs)],
                           [[] for _ in range(bs)])

    def _postprocess(self, inp: ModelInput, logits: torch.Tensor) -> BatchResult:
        bs = inp.batch_size
        sample_rows, rows_of, sampled = [], [], []
        result = BatchResult([None] * bs, [None] * bs, [None] * bs)
        fwd, offset = inp.forward, 0
        if any(inp.draft_lens):
            result.draft_picks = [None] * bs
        for i in range(bs):
            n = fwd.prefix_lens[i] + fwd.extend_lens[i] - inp.logit_starts[i]
            lp, tops, ranks = _prompt_logprobs(inp.prompt_logprobs[i], logits[offset : offset + n])
            result.input_logprobs.append(lp)
            result.input_top_logprobs.append(tops)
            result.input_ranks.append(ranks)
            row = inp.sampling[i]
            if result.draft_picks and inp.draft_lens[i]:
                # a plain greedy row (the scheduler drafts for no other): the argmax at each position
                picks = self.argmax(logits[offset + n - 1 - inp.draft_lens[i] : offset + n]).tolist()
                result.draft_picks[i], result.next_ids[i] = picks, picks[0]
            elif row is not None:
                sample_rows.append(offset + n - 1)
                rows_of.append(row)
                sampled.append(i)
            offset += n
        if rows_of:
            # Decode samples every row in order: skip copying the [bs, vocab] logits.
            picked = logits if len(sample_rows) == logits.shape[0] else logits[sample_rows]
            out = sample(picked, rows_of, [r.banned_ids for r in rows_of], self.default_generator, self.argmax)
            for j, i in enumerate(sampled):
                result.next_ids[i] = out.next_ids[j]
                result.output_logprobs[i] = out.logprobs[j]
                result.output_top_logprobs[i] = out.top_logprobs[j]
        return result


def _block_forms_in_words(weights: list[PackedWeight]) -> str:
    """Which packed float32 weights are also kept as quantized blocks, and up to how many rows
    each form is taken: e.g. "; 120 of 121 weights also as q4_1 blocks (up to 8 rows), 1 as
    q8_0 blocks (up to 8 rows)"; empty when none is."""
    counts = [(form, n) for form in BLOCK_FORMS if (n := sum(p.blocks == form for p in weights))]
    words = [f"{n}{f' of {len(weights)} weights also' if i == 0 else ''} as {form} blocks "
             f"(up to {BLOCK_FORMS[form].few_rows()} rows)" for i, (form, n) in enumerate(counts)]
    return "; " + ", ".join(words) if words else ""


def plain_greedy(inp: ModelInput) -> bool:
    """Whether each request of the step either samples greedily from one logit row with
    nothing that needs the whole row on the host (logprobs, penalties, banned ids, a
    grammar), or needs no logits at all."""
    fwd = inp.forward
    for prefix, ext, start, row, span in zip(fwd.prefix_lens, fwd.extend_lens, inp.logit_starts, inp.sampling,
                                             inp.prompt_logprobs, strict=True):
        rows = prefix + ext - start
        if span is not None or rows != (row is not None):
            return False
        if row is not None and not (row.params.is_greedy and not row.params.has_penalties and not row.banned_ids
                                    and row.allowed is None and not row.options.return_logprob):
            return False
    return True


_RANK_ROWS = 256  # prompt positions whose ranks are counted at once


def _prompt_logprobs(
    span: PromptLogprobs | None, logits: torch.Tensor
) -> tuple[list[tuple[float | None, int]], list[list[tuple[float, int]] | None], list[int | None]]:
    """Logprobs of ``span.targets`` from the logits at the positions before each, after
    ``span.unscored`` (no logprob) where it is set; their top-k; their ranks (how many
    tokens are at least as likely, as vLLM counts)."""
    if span is None:
        return [], [], []
    pairs: list[tuple[float | None, int]] = [] if span.unscored is None else [(None, span.unscored)]
    tops: list[list[tuple[float, int]] | None] = [None] * len(pairs)
    ranks: list[int | None] = [None] * len(pairs)
    if not span.targets:
        return pairs, tops, ranks
    targets = torch.tensor(span.targets)
    logprobs = torch.log_softmax(logits[: len(span.targets)], dim=-1)
    picked_column = logprobs.gather(1, targets.unsqueeze(1))
    for rows in range(0, len(span.targets), _RANK_ROWS):  # a [rows, vocab] mask at a time
        part = slice(rows, rows + _RANK_ROWS)
        ranks += (logprobs[part] >= picked_column[part]).sum(dim=-1).tolist()
    picked = picked_column.squeeze(1).tolist()
    pairs += zip(picked, span.targets, strict=True)
    if span.top_k > 0:
        vals, idx = logprobs.topk(span.top_k, dim=-1)
        tops += [list(zip(v, i, strict=True)) for v, i in zip(vals.tolist(), idx.tolist(), strict=True)]
    else:
        tops += [None] * len(span.targets)
    return pairs, tops, ranks


def _keep_freed_memory_in_process() -> None:
    """Ask glibc to serve allocations up to 32 MiB from its heap and not return freed
    memory to the OS. Each step allocates and frees tensors of a few MiB (activations,
    gathered K/V); by default these are fresh mmap'd pages every time, and the page faults
    cost more than the work (measured: ~25% of a batch-64 decode step)."""
    mallopt = getattr(c_library(), "mallopt", None)
    if mallopt is None:
        return  # not glibc: keep the allocator's defaults
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 1 << 30)
