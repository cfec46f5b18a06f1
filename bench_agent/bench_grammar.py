"""What a JSON-schema constraint costs, and what jump-forward saves, in one run.

    python -m bench_agent.bench_grammar            # ~2 min on 2 cores
    python -m bench_agent.bench_grammar --quick    # smaller, for a smoke check

1. Per-output-token cost: the same prompts at batch 1 and 16, constrained by a schema
   (jump-forward off, so every token is sampled) and then unconstrained with each request
   held to the constrained run's output length (``ignore_eos``): same tokens computed, the
   difference is the grammar's (mask filling, masking, matcher updates).
2. Jump-forward: time to a complete object for a schema of 10 fixed keys, with and without,
   and the model steps each took.
3. Compile time of a 20-property schema: first use, and a second use served by the cache.

Ratios are taken within the run; absolute times on shared machines drift.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from runtime.constrained.grammar_cache import GrammarCache
from runtime.constrained.spec import GrammarSpec


def form_schema(fields: int) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for k in range(fields):
        kind = k % 3
        props[f"field_{k}"] = (
            {"type": "integer", "minimum": 0, "maximum": 999} if kind == 0
            else {"type": "string", "maxLength": 12} if kind == 1
            else {"type": "boolean"}
        )
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _prompts(engine, n: int) -> list[str]:
    return [engine.tokenizer.apply_chat_template([{"role": "user", "content": f"Fill in form number {i} as JSON."}])
            for i in range(n)]


def _timed_generate(engine, prompts: list[str], params: Any) -> tuple[list[dict[str, Any]], float, int]:
    before = engine.core.stats()["num_forward_steps"]
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    secs = time.perf_counter() - start
    return outs, secs, engine.core.stats()["num_forward_steps"] - before


def token_cost(engine, batch: int, schema: dict[str, Any]) -> dict[str, float]:
    prompts = _prompts(engine, batch)
    engine.scheduler.jump_forward = False
    constrained = {"temperature": 0, "max_new_tokens": 200, "json_schema": json.dumps(schema)}
    engine.generate(prompts, constrained)  # compile, warm
    engine.flush_cache()
    outs, c_secs, _ = _timed_generate(engine, prompts, constrained)
    lengths = [len(o["output_ids"]) for o in outs]
    plain = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in lengths]
    engine.flush_cache()
    _, p_secs, _ = _timed_generate(engine, prompts, plain)
    engine.scheduler.jump_forward = engine.args.enable_jump_forward
    tokens = sum(lengths)
    return {"batch": batch, "tokens": tokens, "constrained_ms_per_token": 1000 * c_secs / tokens,
            "plain_ms_per_token": 1000 * p_secs / tokens, "slowdown": c_secs / p_secs}


def jump_forward_gain(engine, schema: dict[str, Any], repeats: int) -> dict[str, float]:
    prompts = _prompts(engine, 1)
    params = {"temperature": 0, "max_new_tokens": 300, "json_schema": json.dumps(schema)}
    engine.generate(prompts, params)  # compile, warm
    best: dict[bool, tuple[float, int]] = {}
    for _ in range(repeats):  # alternate, keep each side's fastest
        for on in (False, True):
            engine.scheduler.jump_forward = on
            engine.flush_cache()
            outs, secs, steps = _timed_generate(engine, prompts, params)
            json.loads(outs[0]["text"])
            if on not in best or secs < best[on][0]:
                best[on] = (secs, steps)
    engine.scheduler.jump_forward = engine.args.enable_jump_forward
    return {"off_s": best[False][0], "on_s": best[True][0], "speedup": best[False][0] / best[True][0],
            "off_steps": best[False][1], "on_steps": best[True][1]}


def compile_times(engine, fields: int) -> dict[str, float]:
    cache = GrammarCache(engine.scheduler.grammars.cache.backend)
    spec = GrammarSpec("json_schema", json.dumps(form_schema(fields)))
    start = time.perf_counter()
    cache.get(spec).result()
    first = time.perf_counter() - start
    start = time.perf_counter()
    cache.get(spec).result()
    second = time.perf_counter() - start
    cache.shutdown()
    return {"fields": fields, "first_ms": 1000 * first, "cached_ms": 1000 * second}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="batch 1 and 4, 2 repeats (a smoke check)")
    ap.add_argument("--dtype", default="auto", help="engine dtype (auto, float32, bfloat16)")
    ns = ap.parse_args()
    from runtime.engine import Engine

    engine = Engine(dtype=ns.dtype)
    try:
        print("| batch | output tokens | constrained ms/token | plain ms/token | constrained / plain |")
        print("|---|---|---|---|---|")
        for batch in (1, 4) if ns.quick else (1, 16):
            r = token_cost(engine, batch, form_schema(6))
            print(f"| {r['batch']} | {r['tokens']} | {r['constrained_ms_per_token']:.1f} | "
                  f"{r['plain_ms_per_token']:.1f} | {r['slowdown']:.3f}x |")
        j = jump_forward_gain(engine, {**form_schema(10)}, 2 if ns.quick else 3)
        print(f"\njump-forward, 10-key schema: {j['off_s'] * 1000:.0f} ms ({j['off_steps']} steps) without, "
              f"{j['on_s'] * 1000:.0f} ms ({j['on_steps']} steps) with: {j['speedup']:.2f}x")
        c = compile_times(engine, 20)
        print(f"compile, 20-property schema: {c['first_ms']:.1f} ms first use, {c['cached_ms']:.3f} ms cached")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
