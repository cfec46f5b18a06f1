"""The agent workloads, by name. Modules load on first use."""

from __future__ import annotations

import importlib

from bench_agent.workloads.base import SIZES, Workload

_MODULES = {
    "critique": "bench_agent.workloads.critique",
    "tree_of_thought": "bench_agent.workloads.tree_of_thought",
    "judge": "bench_agent.workloads.judge",
    "react": "bench_agent.workloads.react",
    "react_fixed": "bench_agent.workloads.react_fixed",
    "multi_turn": "bench_agent.workloads.multi_turn",
    "no_reuse": "bench_agent.workloads.no_reuse",
    "extract": "bench_agent.workloads.extract",
}
ALIASES = {"tot": "tree_of_thought", "chat": "multi_turn", "control": "no_reuse"}
NAMES = tuple(_MODULES)


def get_workload(name: str) -> Workload:
    key = ALIASES.get(name, name)
    if key not in _MODULES:
        raise ValueError(f"unknown workload {name!r}; workloads: {', '.join(NAMES)}")
    return importlib.import_module(_MODULES[key]).WORKLOAD


__all__ = ["NAMES", "SIZES", "Workload", "get_workload"]
