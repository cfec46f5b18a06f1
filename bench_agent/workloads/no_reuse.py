"""The control: independent one-shot prompts of varied length (like ShareGPT traffic), no
shared system prompt, so a prefix cache has nothing to reuse beyond the chat template's
own few opening tokens."""

from __future__ import annotations

from typing import Any

import frontend_lang as sgl
from bench_agent.synth import rng_for, text
from bench_agent.workloads.base import Workload

PRESETS = {
    "tiny": {"min_tokens": 20, "max_tokens": 60, "output_tokens": 3},
    "quick": {"min_tokens": 50, "max_tokens": 800, "output_tokens": 32},
    "full": {"min_tokens": 50, "max_tokens": 1500, "output_tokens": 128},
}


@sgl.function
def no_reuse_program(s, prompt: str, output_tokens: int):
    s += sgl.user(prompt)
    s += sgl.assistant(sgl.gen("reply", max_tokens=output_tokens))


def make_args(index: int, seed: int, sizes: dict[str, int]) -> dict[str, Any]:
    rng = rng_for("no_reuse", seed, index)
    # The prompt opens with its own words: no two prompts share a prefix.
    return {
        "prompt": text(rng, rng.randint(sizes["min_tokens"], sizes["max_tokens"])) + f" (request {index})",
        "output_tokens": sizes["output_tokens"],
    }


WORKLOAD = Workload(
    name="no_reuse",
    summary="control: independent one-shot prompts of varied length, nothing to reuse",
    program=no_reuse_program,
    presets=PRESETS,
    default_programs={"tiny": 2, "quick": 48, "full": 128},
    make_args=make_args,
    gen_calls=lambda z: 1,
)
