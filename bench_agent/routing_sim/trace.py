"""Token streams of the agent workloads, made without a model.

Each workload's DSL program runs against ``TraceBackend``, which records every call and
answers it with synthetic text of the asked length, seeded by the prompt (so a program
gives the same calls whatever its threads' timing). A call depends on every earlier call
of its program whose answer appears in its prompt: that is when the program could send
it. Prompts and answers are then tokenized with the served model's tokenizer, as the
server would.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench_agent.synth import text
from bench_agent.workloads import Workload
from frontend_lang.backend.base import Backend


@dataclass(frozen=True)
class Call:
    prompt: np.ndarray  # token ids
    output: np.ndarray  # token ids of the answer
    deps: tuple[int, ...]  # indices of the calls of the same program it waits for


@dataclass(frozen=True)
class Program:
    calls: tuple[Call, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(c.prompt) for c in self.calls)


class TraceBackend(Backend):
    """Records (prompt, answer) pairs; nothing is prefilled ahead of a fork (as with a chat
    API behind a gateway), so every recorded call is one request."""

    can_cache_prefix = False

    def __init__(self, role_markers: dict[str, Any]) -> None:
        self._markers = role_markers
        self._lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []

    def generate(self, prompt: Any, sampling_params: dict[str, Any], **_: Any) -> Any:
        if isinstance(prompt, list):
            return [self.generate(p, sampling_params) for p in prompt]
        seed = hashlib.sha256(prompt.encode()).hexdigest()
        answer = " " + text(random.Random(seed), max(1, int(sampling_params.get("max_new_tokens", 16))))
        with self._lock:
            self.calls.append((prompt, answer))
        return {"text": answer, "output_ids": [], "meta_info": {"prompt_tokens": 0, "completion_tokens": 0}}

    def generate_stream(self, prompt: str, sampling_params: dict[str, Any], **kw: Any) -> Iterator[dict[str, Any]]:
        yield self.generate(prompt, sampling_params)

    def role_markers(self) -> dict[str, Any]:
        return self._markers

    def end_program(self, program_id: str) -> None:
        pass


def record_program(workload: Workload, args: dict[str, Any], role_markers: dict[str, Any]) -> list[tuple[str, str]]:
    backend = TraceBackend(role_markers)
    state = workload.program.run(backend=backend, pin_cache=False, ignore_eos=True, temperature=0.0, **args)
    state.sync()
    if state.error() is not None:
        raise RuntimeError(f"{workload.name}: {state.error()}")
    # The DSL runs a fork's branches on threads; order the calls so that dependencies come first.
    return sorted(backend.calls, key=lambda c: len(c[0]))


def build_programs(workload: Workload, num_programs: int, size: str, seed: int, tokenizer: Any) -> list[Program]:
    markers = tokenizer.role_markers()
    programs = []
    for args in workload.program_args(num_programs, seed, size):
        calls = record_program(workload, args, markers)
        prompts = tokenizer.batch_encode([p for p, _ in calls], special_tokens=True)
        answers = tokenizer.batch_encode([a for _, a in calls], special_tokens=False)
        programs.append(Program(tuple(
            Call(np.asarray(prompts[i], dtype=np.int64), np.asarray(answers[i], dtype=np.int64),
                 tuple(j for j in range(i) if calls[j][1] in calls[i][0]))
            for i in range(len(calls))
        )))
    return programs


class FastTokenizer:
    """The served model's tokenizer (``tokenizers``, no transformers) and its role markers."""

    def __init__(self, model_dir: Any) -> None:
        from runtime.tokenizer import Tokenizer

        self._tok = Tokenizer(model_dir)

    def role_markers(self) -> dict[str, Any]:
        return self._tok.role_markers()

    def batch_encode(self, texts: list[str], special_tokens: bool) -> list[list[int]]:
        return self._tok.hf(texts, add_special_tokens=special_tokens)["input_ids"]
