"""``prog.cache()`` (SGLang's): prefill a program's fixed opening once, before any run.

The program is run against a recording state with stand-ins for its arguments: it records
what the program appends until the first thing that depends on an argument or on the model
(a ``gen``, a ``select``, any use of an argument, any other use of the state), which ends
the trace. The recorded text and role markers are rendered as a run renders them (the chat
template's own markers) and prefilled if there are more than 64 characters of it, as SGLang
does. Requests would reuse that prefix anyway once the first run computed it; caching it
ahead of time moves that cost before the first run.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from frontend_lang.ir import Constant, Expr, ExprList, RoleBegin, RoleEnd, VarScope, as_expr
from frontend_lang.role_forms import RoleForms

if TYPE_CHECKING:
    from frontend_lang.backend.base import Backend
    from frontend_lang.program import SglFunction

MIN_PREFIX_CHARS = 64  # SGLang's threshold: shorter openings are not worth a request


class _EndOfTrace(Exception):
    """The program used something the trace cannot know."""


class _Argument(Expr):
    """A program argument during the trace: an expression (so ``"Q: " + q`` still records
    the text before it) that ends the trace where it is appended or used in any other way."""

    def __init__(self, name: str) -> None:
        self.name = name

    def describe(self) -> str:
        return f"argument {self.name!r}"

    def _unknown(self, *_: Any, **__: Any) -> Any:
        raise _EndOfTrace(self.name)

    __str__ = __repr__ = __format__ = __mul__ = __rmul__ = _unknown
    __iter__ = __len__ = __getitem__ = __bool__ = __eq__ = __hash__ = __contains__ = __call__ = _unknown

    def __getattr__(self, name: str) -> Any:
        raise _EndOfTrace(self.name)


class _RecordingState(RoleForms):
    """The state during the trace: ``+=`` and the role and var_scope forms record fixed text
    and roles; anything else (a gen, an argument, a read, a fork) ends it."""

    def __init__(self) -> None:
        self.exprs: list[Expr] = []

    def submit(self, expr: Expr, where: str) -> None:
        for item in expr.items if isinstance(expr, ExprList) else [expr]:
            if isinstance(item, VarScope):
                continue  # a variable's bounds add no text
            if not isinstance(item, (Constant, RoleBegin, RoleEnd)):
                raise _EndOfTrace(item.describe())
            self.exprs.append(item)

    def __iadd__(self, other: Any) -> _RecordingState:
        self.submit(as_expr(other), "")
        return self

    def __getattr__(self, name: str) -> Any:
        raise _EndOfTrace(name)

    def __getitem__(self, name: str) -> Any:
        raise _EndOfTrace(name)


def is_recording(state: Any) -> bool:
    """Whether ``state`` is a trace's (a program called inside a traced one is traced too)."""
    return isinstance(state, _RecordingState)


def fixed_opening(program: SglFunction) -> list[Expr]:
    """What ``program`` appends before anything that depends on its arguments or the model."""
    state = _RecordingState()
    arguments = {name: _Argument(name) for name in program.arg_names}
    with contextlib.suppress(Exception):  # the trace ends at the first thing it cannot know, whatever raised
        program.func(state, **{**arguments, **program.bind_arguments})
    return state.exprs


def cache_program(program: SglFunction, backend: Backend) -> str:
    """Prefill ``program``'s fixed opening on ``backend``; the text prefilled ("" if none)."""
    from frontend_lang.state import Program, ProgramState

    run = Program(backend, {}, pin_cache=False, stream=False)
    state = ProgramState(run)
    for expr in fixed_opening(program):
        state._execute(expr)  # noqa: SLF001 - fixed text and role markers: no model call
    prefix = state.text_
    if len(prefix) <= MIN_PREFIX_CHARS or not backend.can_cache_prefix:
        return ""
    backend.cache_prefix(prefix)
    return prefix
