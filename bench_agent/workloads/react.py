"""ReAct through real tool calls, as an agent framework runs it: shared instructions, a
question, then ``steps`` rounds of a required call of the ``search`` tool (OpenAI's
``tools`` / ``tool_choice`` on the chat API; the call format's grammar on the native API)
whose result goes back as a ``tool`` message, then a plain answer with the tools still shown
(``tool_choice: "none"``, fixed length).

The control flow never depends on the model: every step makes exactly one call
(``required``, ``parallel_tool_calls: false``) and the tool's reply depends only on the
seed, the program and the step. A call ends where its grammar does (its query is bounded
by the tool's schema), so its length depends on the server's call format: the same on the
DSL and OpenAI drivers of one forkserve server, not across servers. ``react_fixed`` is the
same agent with its actions as fixed-length text, for comparing servers."""

from __future__ import annotations

import time
from typing import Any

import frontend_lang as sgl
from bench_agent.synth import rng_for, text
from bench_agent.workloads.base import Workload

PRESETS = {
    "tiny": {"instructions_tokens": 40, "query_chars": 8, "observation_tokens": 10, "answer_tokens": 3, "steps": 2},
    "quick": {"instructions_tokens": 400, "query_chars": 24, "observation_tokens": 60, "answer_tokens": 16, "steps": 3},
    "full": {"instructions_tokens": 800, "query_chars": 48, "observation_tokens": 120, "answer_tokens": 32, "steps": 5},
}


def search_tools(query_chars: int) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {
        "name": "search", "description": "Look a query up in the knowledge base",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": query_chars}},
                       "required": ["query"], "additionalProperties": False}}}]


def call_tokens(query_chars: int) -> int:
    """Room for one call: the markup and keys (~25 tokens in the formats we know) and a query
    of two tokens per character at worst."""
    return 2 * query_chars + 40


def search_tool(seed: int, index: int, step: int, tokens: int, latency_s: float = 0.0) -> str:
    """The tool: a fixed synthetic knowledge base, so runs are reproducible and the reply's
    length does not depend on the query."""
    if latency_s:
        time.sleep(latency_s)
    return f"search returned {step % 7 + 1} results. " + text(rng_for("react/obs", seed, index, step), tokens)


@sgl.function
def react_program(
    s,
    instructions: str,
    question: str,
    seed: int,
    index: int,
    steps: int,
    query_chars: int,
    observation_tokens: int,
    answer_tokens: int,
    tool_latency_s: float = 0.0,
):
    tools = search_tools(query_chars)
    s += sgl.system(instructions)
    s += sgl.user(question)
    for step in range(steps):
        s += sgl.assistant(sgl.gen(f"action_{step}", max_tokens=call_tokens(query_chars), tools=tools,
                                   tool_choice="required", parallel_tool_calls=False))
        calls = s[f"action_{step}"]
        if len(calls) != 1:
            raise RuntimeError(f"step {step}: expected one call, got {len(calls)} (cut off by max_tokens?)")
        s += sgl.tool(search_tool(seed, index, step, observation_tokens, tool_latency_s), calls[0].id)
    s += sgl.user("Give the final answer now.")
    s += sgl.assistant(sgl.gen("answer", max_tokens=answer_tokens, tools=tools, tool_choice="none"))


def agent_args(index: int, seed: int, sizes: dict[str, int], preamble: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """One program's arguments, shared with ``react_fixed``: the instructions (``preamble``
    and synthetic background), its question, and the sizes named by ``keys``."""
    return {
        "instructions": preamble + text(rng_for("react/instructions", seed), sizes["instructions_tokens"]),
        "question": f"Question {index}: " + text(rng_for("react/question", seed, index), 30),
        "seed": seed,
        "index": index,
        **{k: sizes[k] for k in keys},
    }


def make_args(index: int, seed: int, sizes: dict[str, int]) -> dict[str, Any]:
    preamble = ("Answer the question. Search the knowledge base with the search tool, one query per turn, "
                "until you know the answer. Background: ")
    return agent_args(index, seed, sizes, preamble, ("steps", "query_chars", "observation_tokens", "answer_tokens"))


WORKLOAD = Workload(
    name="react",
    summary="shared instructions, steps of a required tool call and its result as a tool message, then an answer",
    program=react_program,
    presets=PRESETS,
    default_programs={"tiny": 2, "quick": 8, "full": 16},
    make_args=make_args,
    gen_calls=lambda z: z["steps"] + 1,
    fixed_lengths=False,
)
