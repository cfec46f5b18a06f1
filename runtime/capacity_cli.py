"""``forkserve capacity``: the capacity plan of ``runtime/capacity.py`` for a model and a
KV pool, printed (or as JSON). Reads the model's config only; loads no weights.

    forkserve capacity --context-tokens 8000 --shared-prefix-tokens 1500 --concurrent-programs 200
    forkserve capacity --model-path DIR --dtype bfloat16 --device-memory 80 --kv-cache-memory 60
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from runtime.capacity import (
    Plan,
    available_memory_bytes,
    keeps_weight_blocks,
    kv_bytes_per_token,
    largest_pool,
    meminfo_bytes,
    model_config,
    num_parameters,
    packs_on_cpu,
    pool_tokens,
    weight_bytes,
)
from runtime.cli_types import fraction, int_at_least, nonnegative_int, positive_float, positive_int
from runtime.config import MIN_KV_TOKENS

_GIB = 2**30


def add_capacity_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity",
        help="How many agent programs one replica's KV pool holds, and how many replicas a load needs.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = " (default: %(default)s)"
    p.add_argument("--model-path", help="Model folder or .gguf file, as for serve (default: the default model).")
    p.add_argument("--dtype", choices=["auto", "float32", "float", "bfloat16"], default="auto",
                   help="KV and weight dtype; auto resolves as serve does on this machine" + d)
    p.add_argument("--max-total-tokens", type=int_at_least(MIN_KV_TOKENS), help="One replica's KV pool in tokens, as for serve "
                   "(serve --dp-size N splits its own value over N replicas: give that share here).")
    p.add_argument("--kv-cache-memory", type=positive_float, default=1.0,
                   help="GiB of one replica's KV pool when --max-total-tokens is not given, as for serve (serve "
                   "--dp-size N splits its own value over N replicas: give that share here)" + d)
    p.add_argument("--context-tokens", type=positive_int, default=4096,
                   help="Tokens of one agent program's context at its longest (prompt and outputs)" + d)
    p.add_argument("--shared-prefix-tokens", type=nonnegative_int, default=0,
                   help="Tokens at the start of every program's context that all programs share (a system "
                   "prompt); stored once per replica" + d)
    p.add_argument("--concurrent-programs", type=positive_int, help="Programs to run at once: how many replicas they need.")
    p.add_argument("--device-memory", type=positive_float, help="GiB of memory of one replica's device, to show the largest "
                   "pool that fits beside the weights (default: this machine's GPU, else its RAM).")
    p.add_argument("--usable-fraction", type=fraction, default=0.9,
                   help="Share of --device-memory that weights and KV may take; the rest is for activations "
                   "and the runtime" + d)
    p.add_argument("--json", action="store_true", help="Print the figures as one JSON object.")
    p.set_defaults(func=run_capacity)


def run_capacity(ns: argparse.Namespace) -> int:
    try:
        args = checked_args(ns)
    except ValueError as err:  # the flags: before anything is read
        print(f"forkserve capacity: {err}", file=sys.stderr)
        return 2
    try:
        report = capacity_report(ns, args)
    except (ValueError, OSError) as err:  # the model, as serve and generate report it
        print(f"forkserve capacity: {err}", file=sys.stderr)
        return 1
    if ns.json:
        print(json.dumps(report))
    else:
        print(render(report))
    return 0


def checked_args(ns: argparse.Namespace) -> Any:
    """The flags as ``ServerArgs`` (checked as serve checks them)."""
    from runtime.arg_fields import fields_as_flags
    from runtime.config import ServerArgs

    if ns.context_tokens <= ns.shared_prefix_tokens:
        raise ValueError("--context-tokens must exceed --shared-prefix-tokens")
    given = {"model_path": ns.model_path, "dtype": ns.dtype, "max_total_tokens": ns.max_total_tokens,
             "kv_cache_memory": ns.kv_cache_memory}
    try:
        return ServerArgs(**given)
    except ValueError as err:
        raise ValueError(fields_as_flags(str(err), list(given))) from err


def capacity_report(ns: argparse.Namespace, args: Any) -> dict[str, Any]:
    folder, cfg = model_config(ns.model_path)
    dtype = args.resolved_dtype
    kv = kv_bytes_per_token(cfg, dtype)
    params = num_parameters(cfg)
    packed = packs_on_cpu(args)
    plan = Plan(kv, weight_bytes(cfg, dtype, packed), pool_tokens(kv, ns.max_total_tokens, ns.kv_cache_memory),
                ns.context_tokens, ns.shared_prefix_tokens)
    device = ns.device_memory * _GIB if ns.device_memory is not None else _device_bytes(args.resolved_device)
    return {
        "model": str(folder), "dtype": dtype, "layers": cfg.num_layers, "kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "parameters": params, "weight_bytes": plan.weight_bytes,
        "blocks_too": keeps_weight_blocks(args),
        "packed_output_layer_copy": packed and cfg.tie_word_embeddings,
        "kv_bytes_per_token": kv, "pool_tokens": plan.pool_tokens, "pool_bytes": plan.pool_bytes,
        "context_tokens": ns.context_tokens, "shared_prefix_tokens": ns.shared_prefix_tokens,
        "programs_per_replica": plan.programs_per_replica,
        "concurrent_programs": ns.concurrent_programs,
        "replicas_needed": plan.replicas_for(ns.concurrent_programs) if ns.concurrent_programs is not None else None,
        "device_bytes": int(device), "usable_fraction": ns.usable_fraction,
        "model_context_tokens": cfg.max_position_embeddings,
        # what serve checks a CPU pool against when it starts (other programs hold the rest)
        "available_bytes": available_memory_bytes() if ns.device_memory is None and args.resolved_device == "cpu" else None,
        "largest_pool_tokens": largest_pool(kv, plan.weight_bytes, device, ns.usable_fraction),
    }


def _device_bytes(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    total = meminfo_bytes("MemTotal")
    if total is None:
        raise ValueError("this machine's memory is unknown (no /proc/meminfo): give --device-memory")
    return total


def render(r: dict[str, Any]) -> str:
    per_program = r["context_tokens"] - r["shared_prefix_tokens"]
    largest = r["largest_pool_tokens"]
    lines = [
        f"model             {r['model']}",
        f"                  {r['parameters'] / 1e6:,.1f}M parameters, {r['weight_bytes'] / _GIB:.2f} GiB of weights "
        f"in {r['dtype']}" + (" (the tied output layer also packed for the CPU GEMM)"
                              if r["packed_output_layer_copy"] else ""),
        *(["                  on paper: a float32 server on this CPU (AVX2, no AVX-512) also keeps weights that are "
           "exact 4- or 8-bit blocks (GGUF Q4_1, Q8_0) in that form, ~0.1 GiB more for the default model; its ready "
           "line says what it holds"] if r["blocks_too"] else []),
        f"KV per token      2 x {r['layers']} layers x {r['kv_heads']} KV heads x {r['head_dim']} x "
        f"{r['kv_bytes_per_token'] // (2 * r['layers'] * r['kv_heads'] * r['head_dim'])} bytes "
        f"= {r['kv_bytes_per_token']:,} bytes",
        f"KV pool           {r['pool_tokens']:,} tokens = {r['pool_bytes'] / _GIB:.2f} GiB per replica",
        f"one program       {r['context_tokens']:,} tokens of context, {r['shared_prefix_tokens']:,} of them shared "
        f"by all programs ({per_program * r['kv_bytes_per_token'] / 2**20:,.1f} MiB of KV of its own)",
        f"per replica       {r['programs_per_replica']:,} programs at once, each with its whole context cached",
    ]
    if r["replicas_needed"] is not None:
        lines.append(f"replicas needed   {r['replicas_needed']:,} for {r['concurrent_programs']:,} programs at once")
    elif r["concurrent_programs"]:
        lines.append("replicas needed   none suffices: one program's context does not fit in the pool")
    room = f"{r['usable_fraction']:.0%} of {r['device_bytes'] / _GIB:.1f} GiB"
    if largest < MIN_KV_TOKENS:
        lines.append(f"largest pool      none: the weights leave no room for a KV pool in {room}")
    else:  # rounded down, so the flag never asks for more than fits
        gib = math.floor(largest * r["kv_bytes_per_token"] / _GIB * 100) / 100
        lines.append(f"largest pool      {largest:,} tokens ({gib:.2f} GiB) beside the weights in {room}"
                     + ("" if r["available_bytes"] is not None else f": --kv-cache-memory {gib:.2f}"))
    if r["available_bytes"] is not None:
        fits = min(largest * r["kv_bytes_per_token"], r["available_bytes"] - r["weight_bytes"])  # after the weights load
        now = math.floor(max(fits, 0) / _GIB * 100) / 100
        lines.append(f"available now     {r['available_bytes'] / _GIB:.1f} GiB of memory (serve refuses a larger pool "
                     f"on this machine): --kv-cache-memory {now:.2f} at most")
    if r["pool_tokens"] > largest:
        lines.append(f"note              this pool ({r['pool_bytes'] / _GIB:.2f} GiB) does not fit beside the weights in "
                     f"{room}: the figures above assume memory this device lacks")
    elif r["available_bytes"] is not None and r["pool_bytes"] + r["weight_bytes"] > r["available_bytes"]:
        lines.append("note              serve would refuse this pool on this machine now (see 'available now')")
    if r["programs_per_replica"] == 0:
        lines.append(f"note              one program's {r['context_tokens']:,} tokens of context do not fit in this "
                     f"pool of {r['pool_tokens']:,}: give a larger pool or fewer --context-tokens")
    if r["context_tokens"] > r["model_context_tokens"]:
        lines.append(f"note              {r['context_tokens']:,} tokens of context are beyond the model's "
                     f"{r['model_context_tokens']:,}")
    return "\n".join(lines)
