"""What a workload is: a DSL program, size presets, and the seeded arguments of each run.

A workload is written once as a ``frontend_lang`` program using only chat roles and
``gen`` calls that open an assistant turn, so the same program runs on every driver: the
DSL itself, any OpenAI-compatible chat server, and transformers in-process. Outputs have
fixed lengths (the runner sends ``ignore_eos``; a workload whose outputs end with their
grammar says so with ``fixed_lengths=False``) and the control flow never depends on the
generated text, so every backend does the same amount of work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from frontend_lang.program import SglFunction

SIZES = ("tiny", "quick", "full")


@dataclass(frozen=True)
class Workload:
    name: str
    summary: str
    program: SglFunction
    # preset name -> the size knobs (tokens of each part, rounds, widths, ...)
    presets: dict[str, dict[str, int]]
    # preset name -> how many programs a run has by default
    default_programs: dict[str, int]
    # (program index, seed, sizes) -> the program's keyword arguments
    make_args: Callable[[int, int, dict[str, int]], dict[str, Any]]
    # sizes -> the number of gen calls one program makes
    gen_calls: Callable[[dict[str, int]], int]
    # whether every gen runs to its max_tokens (ignore_eos); False where a grammar ends it
    fixed_lengths: bool = True

    def sizes(self, size: str) -> dict[str, int]:
        if size not in self.presets:
            raise ValueError(f"workload {self.name!r} has no size {size!r}; sizes: {', '.join(self.presets)}")
        return dict(self.presets[size])

    def program_args(self, num_programs: int, seed: int, size: str) -> list[dict[str, Any]]:
        sizes = self.sizes(size)
        return [self.make_args(i, seed, sizes) for i in range(num_programs)]
