"""The branches of a ``fork``: appending to all of them at once, and ``join``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from frontend_lang.call_site import caller_line
from frontend_lang.ir import Expr, as_expr

if TYPE_CHECKING:
    from frontend_lang.state import ProgramState


class ProgramStateGroup:
    """The branches of a fork. ``+=`` appends to every branch: one expression for all, a
    list or tuple (one each), or a function of the branch index."""

    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states = states
        self.parent = parent

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, state: ProgramState) -> None:
        """What ``forks[i] += expr`` stores back: the branch itself (appended to in place)."""
        if state is not self.states[i]:
            raise ValueError("a fork's branches cannot be replaced; append to them with +=")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        where = caller_line()
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"appending {len(other)} expressions to {len(self.states)} branches")
            parts: list[Any] = list(other)
        elif callable(other) and not isinstance(other, Expr):
            fn: Callable[[int], Any] = other
            parts = [fn(i) for i in range(len(self.states))]
        else:
            parts = [other] * len(self.states)
        for state, part in zip(self.states, parts, strict=True):
            state.submit(as_expr(part), where)
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every branch; copy each variable a branch set after the fork into the
        parent as a list of every branch's value (None where a branch has none). Variables
        the branches only inherited stay as they are in the parent. (SGLang gathers the names
        its parent lacks; here a branch that sets an inherited name again is gathered too.)"""
        if mode != "gather_variable":
            raise ValueError(f"join(): only mode 'gather_variable' is supported, got {mode!r}")
        for s in self.states:
            s.sync()
        names = set().union(*(s.set_names for s in self.states))
        self.parent.sync()
        for name in sorted(names):
            gathered = [s.variables.get(name) for s in self.states]
            self.parent._store(name, gathered, [s.meta_info.get(name) for s in self.states])
