"""The numbers one run is summarised by."""

from __future__ import annotations

from typing import Any

import numpy as np

from bench_agent.runner import RunResult

PERCENTILES = (50, 90, 99)


def _percentiles(values: list[float], scale: float, prefix: str) -> dict[str, float | None]:
    if not values:
        return {f"{prefix}_p{p}": None for p in PERCENTILES}
    got = np.percentile(np.asarray(values), PERCENTILES)
    return {f"{prefix}_p{p}": float(v) * scale for p, v in zip(PERCENTILES, got, strict=True)}


def summarise(result: RunResult) -> dict[str, Any]:
    """Throughput over the run's wall time; latencies per call (TTFT, inter-token gap,
    end to end) and per program; the share of prompt tokens served from the cache (``None``
    when the server does not report cached tokens)."""
    gens = [r for r in result.records if r.kind == "gen"]
    prompt = sum(r.prompt_tokens for r in result.records)
    reported = [r for r in result.records if r.cached_tokens is not None]
    cached = sum(r.cached_tokens or 0 for r in reported)
    # a hit rate only when every request said how much of its prompt was cached
    every_call_reported = bool(reported) and len(reported) == len(result.records)
    output = sum(r.completion_tokens for r in gens)
    done = len(result.program_latencies)
    out: dict[str, Any] = {
        "programs": result.num_programs,
        "programs_ok": done,
        "errors": len(result.errors),
        "gen_calls": len(gens),
        # calls that stopped before their fixed length: a server ignoring ignore_eos makes
        # the sides do different work, so runs with these do not compare
        "short_calls": sum(r.completion_tokens < r.max_new_tokens for r in gens),
        "prefill_calls": len(result.records) - len(gens),
        "wall_s": result.wall_s,
        "programs_per_s": done / result.wall_s if result.wall_s > 0 else 0.0,
        "output_tok_per_s": output / result.wall_s if result.wall_s > 0 else 0.0,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "cached_tokens": cached if reported else None,
        "cache_hit_rate": cached / max(1, prompt) if every_call_reported else None,
        "peak_kv_usage": result.peak_kv_usage,
    }
    out |= _percentiles([r.first_token - r.start for r in gens if r.first_token is not None], 1000, "ttft_ms")
    out |= _percentiles([g for r in gens for g in r.itls], 1000, "itl_ms")
    out |= _percentiles([r.end - r.start for r in gens], 1, "e2e_s")
    out |= _percentiles(result.program_latencies, 1, "program_s")
    return out
