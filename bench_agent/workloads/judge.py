"""LLM-as-judge: a shared rubric, a question and an answer to grade, a fork per rubric
dimension (each scores one dimension), then one call that sums the scores up."""

from __future__ import annotations

from typing import Any

import frontend_lang as sgl
from bench_agent.synth import rng_for, text
from bench_agent.workloads.base import Workload

PRESETS = {
    "tiny": {"rubric_tokens": 40, "answer_tokens": 30, "dimensions": 2, "score_tokens": 3, "summary_tokens": 3},
    "quick": {"rubric_tokens": 300, "answer_tokens": 300, "dimensions": 4, "score_tokens": 16, "summary_tokens": 24},
    "full": {"rubric_tokens": 600, "answer_tokens": 500, "dimensions": 6, "score_tokens": 32, "summary_tokens": 48},
}
DIMENSIONS = ("correctness", "completeness", "clarity", "concision", "safety", "style", "evidence", "tone")


@sgl.function
def judge_program(s, rubric: str, question: str, answer: str, dimensions: int, score_tokens: int, summary_tokens: int):
    s += sgl.system(rubric)
    s += sgl.user(f"Question: {question}\nAnswer to grade: {answer}")
    branches = s.fork(dimensions)
    branches += lambda i: sgl.user(
        f"Grade only the {DIMENSIONS[i % len(DIMENSIONS)]} of the answer: a score from 1 to 10 and one reason."
    ) + sgl.assistant(sgl.gen("grade", max_tokens=score_tokens))
    grades = "\n".join(f"{DIMENSIONS[i % len(DIMENSIONS)]}: {b['grade']}" for i, b in enumerate(branches))
    s += sgl.user(f"The grades per dimension:\n{grades}\nGive the overall verdict.")
    s += sgl.assistant(sgl.gen("verdict", max_tokens=summary_tokens))


def make_args(index: int, seed: int, sizes: dict[str, int]) -> dict[str, Any]:
    return {
        "rubric": "You grade answers against this rubric. " + text(rng_for("judge/rubric", seed), sizes["rubric_tokens"]),
        "question": f"Question {index}: " + text(rng_for("judge/question", seed, index), 30),
        "answer": text(rng_for("judge/answer", seed, index), sizes["answer_tokens"]),
        **{k: sizes[k] for k in ("dimensions", "score_tokens", "summary_tokens")},
    }


WORKLOAD = Workload(
    name="judge",
    summary="shared rubric, an answer to grade, one fork per rubric dimension, then a verdict",
    program=judge_program,
    presets=PRESETS,
    default_programs={"tiny": 2, "quick": 8, "full": 16},
    make_args=make_args,
    gen_calls=lambda z: z["dimensions"] + 1,
)
