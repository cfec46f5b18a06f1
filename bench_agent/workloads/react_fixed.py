"""ReAct with its actions written as text: shared instructions with a tool description and
a worked example, a question, then ``steps`` rounds of thought-and-action of fixed length
followed by the tool's observation, then the answer. The fixed-work form of ``react``
(which calls its tool through real tool calls): no grammar ends an output, so every server
computes the same tokens, whatever its tool-call format. The tool is local and
deterministic: its reply depends only on the seed, the program, the step and the number of
words in the action, so its length is the same on every backend. (Its text is what ``react``
sent before it used tool calls: the same seeds give the same programs.)"""

from __future__ import annotations

import time
from typing import Any

import frontend_lang as sgl
from bench_agent.synth import rng_for, text
from bench_agent.workloads.base import Workload
from bench_agent.workloads.react import agent_args

PRESETS = {
    "tiny": {"instructions_tokens": 40, "step_tokens": 3, "observation_tokens": 10, "answer_tokens": 3, "steps": 2},
    "quick": {"instructions_tokens": 400, "step_tokens": 24, "observation_tokens": 60, "answer_tokens": 16, "steps": 3},
    "full": {"instructions_tokens": 800, "step_tokens": 48, "observation_tokens": 120, "answer_tokens": 32, "steps": 5},
}


def search_tool(action: str, seed: int, index: int, step: int, tokens: int, latency_s: float = 0.0) -> str:
    """The tool: a fixed synthetic knowledge base, so runs are reproducible."""
    if latency_s:
        time.sleep(latency_s)
    words = len(action.split())
    return f"search returned {words % 7 + 1} results. " + text(rng_for("react/obs", seed, index, step), tokens)


@sgl.function
def react_program(
    s,
    instructions: str,
    question: str,
    seed: int,
    index: int,
    steps: int,
    step_tokens: int,
    observation_tokens: int,
    answer_tokens: int,
    tool_latency_s: float = 0.0,
):
    s += sgl.system(instructions)
    s += sgl.user(question)
    for step in range(steps):
        s += sgl.assistant(sgl.gen(f"action_{step}", max_tokens=step_tokens))
        observation = search_tool(s[f"action_{step}"], seed, index, step, observation_tokens, tool_latency_s)
        s += sgl.user(f"Observation {step + 1}: {observation}")
    s += sgl.user("Give the final answer now.")
    s += sgl.assistant(sgl.gen("answer", max_tokens=answer_tokens))


def make_args(index: int, seed: int, sizes: dict[str, int]) -> dict[str, Any]:
    preamble = ("Answer the question. In each turn write a Thought and an Action; the action "
                "search[query] returns what the knowledge base holds about the query. Example: ")
    return agent_args(index, seed, sizes, preamble, ("steps", "step_tokens", "observation_tokens", "answer_tokens"))


WORKLOAD = Workload(
    name="react_fixed",
    summary="react with its actions as fixed-length text instead of tool calls (the same work on every server)",
    program=react_program,
    presets=PRESETS,
    default_programs={"tiny": 2, "quick": 8, "full": 16},
    make_args=make_args,
    gen_calls=lambda z: z["steps"] + 1,
)
