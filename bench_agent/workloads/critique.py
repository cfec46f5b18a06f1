"""Self-critique: a shared system prompt and a task, a draft, then ``rounds`` of critique
(with a score) and revision, each call carrying the whole conversation."""

from __future__ import annotations

from typing import Any

import frontend_lang as sgl
from bench_agent.synth import rng_for, text
from bench_agent.workloads.base import Workload

PRESETS = {
    "tiny": {"system_tokens": 40, "task_tokens": 30, "answer_tokens": 4, "critique_tokens": 3, "rounds": 1},
    # An agent's system prompt (role, rules, tool descriptions) runs to a thousand tokens or
    # more; its answers in a loop like this are short.
    "quick": {"system_tokens": 800, "task_tokens": 300, "answer_tokens": 24, "critique_tokens": 12, "rounds": 2},
    "full": {"system_tokens": 1500, "task_tokens": 500, "answer_tokens": 96, "critique_tokens": 32, "rounds": 3},
}


@sgl.function
def critique_program(s, system: str, task: str, answer_tokens: int, critique_tokens: int, rounds: int):
    s += sgl.system(system)
    s += sgl.user(task)
    s += sgl.assistant(sgl.gen("draft_0", max_tokens=answer_tokens))
    for r in range(rounds):
        s += sgl.user("Critique the draft above and end with a score from 1 to 10.")
        s += sgl.assistant(sgl.gen(f"critique_{r}", max_tokens=critique_tokens))
        s += sgl.user("Rewrite the draft so that it answers the critique.")
        s += sgl.assistant(sgl.gen(f"draft_{r + 1}", max_tokens=answer_tokens))


def make_args(index: int, seed: int, sizes: dict[str, int]) -> dict[str, Any]:
    return {
        "system": "You are a careful writer who reviews and improves your own drafts. "
        + text(rng_for("critique/system", seed), sizes["system_tokens"]),
        "task": f"Task {index}: " + text(rng_for("critique/task", seed, index), sizes["task_tokens"]),
        "answer_tokens": sizes["answer_tokens"],
        "critique_tokens": sizes["critique_tokens"],
        "rounds": sizes["rounds"],
    }


WORKLOAD = Workload(
    name="critique",
    summary="shared system prompt + task, draft, then rounds of critique-with-score and revise",
    program=critique_program,
    presets=PRESETS,
    default_programs={"tiny": 2, "quick": 16, "full": 32},
    make_args=make_args,
    gen_calls=lambda z: 1 + 2 * z["rounds"],
)
