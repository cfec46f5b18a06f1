"""Multi-turn chat: a shared system prompt, then ``turns`` user messages, each answered
with the whole conversation resent."""

from __future__ import annotations

from typing import Any

import frontend_lang as sgl
from bench_agent.synth import rng_for, text
from bench_agent.workloads.base import Workload

PRESETS = {
    "tiny": {"system_tokens": 30, "user_tokens": 20, "reply_tokens": 3, "turns": 2},
    "quick": {"system_tokens": 200, "user_tokens": 80, "reply_tokens": 32, "turns": 4},
    "full": {"system_tokens": 400, "user_tokens": 150, "reply_tokens": 96, "turns": 8},
}


@sgl.function
def multi_turn_program(s, system: str, messages: list[str], reply_tokens: int):
    s += sgl.system(system)
    for turn, message in enumerate(messages):
        s += sgl.user(message)
        s += sgl.assistant(sgl.gen(f"reply_{turn}", max_tokens=reply_tokens))


def make_args(index: int, seed: int, sizes: dict[str, int]) -> dict[str, Any]:
    return {
        "system": "You are a helpful assistant. " + text(rng_for("chat/system", seed), sizes["system_tokens"]),
        "messages": [
            f"Turn {t + 1}: " + text(rng_for("chat/user", seed, index, t), sizes["user_tokens"])
            for t in range(sizes["turns"])
        ],
        "reply_tokens": sizes["reply_tokens"],
    }


WORKLOAD = Workload(
    name="multi_turn",
    summary="shared system prompt, turns of user messages, whole conversation resent each turn",
    program=multi_turn_program,
    presets=PRESETS,
    default_programs={"tiny": 2, "quick": 8, "full": 16},
    make_args=make_args,
    gen_calls=lambda z: z["turns"],
)
