"""Tree of thought: a question, then ``depth`` levels of ``width``-way forks (each branch
explores a named approach), then one judge call over every leaf."""

from __future__ import annotations

from typing import Any

import frontend_lang as sgl
from bench_agent.synth import rng_for, text
from bench_agent.workloads.base import Workload

PRESETS = {
    "tiny": {"question_tokens": 30, "width": 2, "depth": 1, "thought_tokens": 3, "verdict_tokens": 3},
    "quick": {"question_tokens": 400, "width": 2, "depth": 2, "thought_tokens": 24, "verdict_tokens": 16},
    "full": {"question_tokens": 600, "width": 3, "depth": 2, "thought_tokens": 48, "verdict_tokens": 32},
}
APPROACHES = ("from first principles", "by analogy", "backwards from the goal", "by listing cases", "by a counterexample")


@sgl.function
def tree_of_thought_program(
    s, system: str, question: str, width: int, depth: int, thought_tokens: int, verdict_tokens: int
):
    s += sgl.system(system)
    s += sgl.user(question)
    leaves = [s]
    for level in range(depth):
        grown = []
        for leaf in leaves:
            branches = leaf.fork(width)
            branches += lambda i, level=level: sgl.user(
                f"Step {level + 1}: continue {APPROACHES[i % len(APPROACHES)]}."
            ) + sgl.assistant(sgl.gen("thought", max_tokens=thought_tokens))
            grown.extend(branches)
        leaves = grown
    listing = "\n".join(f"Line {i + 1}: {leaf['thought']}" for i, leaf in enumerate(leaves))
    s += sgl.user(f"These are the candidate lines of reasoning:\n{listing}\nWhich one is best, and why?")
    s += sgl.assistant(sgl.gen("verdict", max_tokens=verdict_tokens))


def make_args(index: int, seed: int, sizes: dict[str, int]) -> dict[str, Any]:
    return {
        "system": "You solve problems by exploring several lines of reasoning.",
        "question": f"Problem {index}: " + text(rng_for("tot/question", seed, index), sizes["question_tokens"]),
        **{k: sizes[k] for k in ("width", "depth", "thought_tokens", "verdict_tokens")},
    }


WORKLOAD = Workload(
    name="tree_of_thought",
    summary="question, depth levels of width-way forks, then a judge over all leaves",
    program=tree_of_thought_program,
    presets=PRESETS,
    default_programs={"tiny": 2, "quick": 8, "full": 16},
    make_args=make_args,
    gen_calls=lambda z: sum(z["width"] ** (level + 1) for level in range(z["depth"])) + 1,
)
