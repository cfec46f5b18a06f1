"""A running program's state: its text, variables and chat messages, and the executor
that runs what the program appends.

``s += expr`` only queues ``expr``; a worker thread per state runs the queue in order
against the backend. So the branches of a fork run at the same time and their requests
reach the scheduler together. Reading (``s["x"]``, ``s.text()``) waits for the queue.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from frontend_lang.backend.base import Backend
from frontend_lang.call_site import caller_line
from frontend_lang.choices import select_choice
from frontend_lang.fork_group import ProgramStateGroup
from frontend_lang.ir import (
    Constant,
    Expr,
    ExprList,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    ToolResult,
    VarScope,
    as_expr,
    reasoning_name,
)
from frontend_lang.role_forms import RoleForms
from frontend_lang.streamed_text import StreamedText
from frontend_lang.tool_turns import ToolTurns
from frontend_lang.tools import ToolUse, has_tool_turns
from runtime.server.reasoning import PARSERS as REASONING_PARSERS
from runtime.server.reasoning import StreamingReasoning

logger = logging.getLogger(__name__)


class ProgramError(RuntimeError):
    """An operation of a program failed; the message names it and the program line."""


_INTERRUPTED = "the program was interrupted (Ctrl-C)"


class Program:
    """What all states of one ``run`` share: backend, defaults, the id that pins the
    program's prefixes in the server's cache, and every state (to wait for them at the end)."""

    def __init__(self, backend: Backend, defaults: dict[str, Any], pin_cache: bool, stream: bool) -> None:
        self.backend = backend
        self.defaults = defaults
        self.program_id = f"prog-{uuid.uuid4().hex[:16]}" if pin_cache and backend.pins_programs else None
        self.stream = stream
        self.states: list[ProgramState] = []
        self.lock = threading.Lock()
        self._markers: dict[str, Any] | None = None
        self.body_thread: threading.Thread | None = None  # run(stream=True): the program body's thread
        self.interrupted = False

    def interrupt(self) -> None:
        """Ctrl-C: nothing more is sent, what is queued is dropped, and every reader wakes up
        (reads raise ``ProgramError``). A request already sent ends on its own, or with this
        process, whose closed connection the server takes as an abort."""
        self.interrupted = True
        with self.lock:
            states = list(self.states)
        for s in states:
            s.drop_pending()

    def read_waits_for_the_end(self) -> bool:
        """A streamed run read from outside its body: reading waits until the program ends."""
        return self.body_thread is not None and threading.current_thread() is not self.body_thread

    @property
    def markers(self) -> dict[str, Any]:
        if self._markers is None:
            self._markers = self.backend.role_markers()
        return self._markers

    def sync_all(self) -> None:
        with self.lock:
            states = list(self.states)
        for s in states:
            s.sync(raise_error=False)

    def end(self) -> None:
        if self.program_id is not None:
            self.backend.end_program(self.program_id)


class ProgramState(StreamedText, RoleForms, ToolTurns):
    def __init__(self, program: Program, parent: ProgramState | None = None) -> None:
        self.program = program
        self.text_ = parent.text_ if parent else ""
        self.variables: dict[str, Any] = dict(parent.variables) if parent else {}
        self.meta_info: dict[str, Any] = dict(parent.meta_info) if parent else {}
        self.messages_: list[dict[str, Any]] = list(parent.messages_) if parent else []
        self.role: str | None = parent.role if parent else None
        self.role_start = parent.role_start if parent else 0
        # chats with tools: whether messages_[0] is the template's default system turn (the
        # chat API adds it unseen), the conversation's tools, and the calls of the open turn
        self.implicit_system = parent.implicit_system if parent else False
        self.tools_: ToolUse | None = parent.tools_ if parent else None
        self.turn_calls: tuple[str, list[Any], int] | None = parent.turn_calls if parent else None
        self.scope_starts: dict[str, int] = dict(parent.scope_starts) if parent else {}  # open var_scopes
        self.set_names: set[str] = set()  # variables set in this state (a branch: since its fork)
        self.ret_value: Any = None
        self._error: BaseException | None = None
        self._pending: collections.deque[tuple[Expr, str]] = collections.deque()
        self._running = False
        self._cond = threading.Condition()
        # streaming: (the variables the text is part of, text, whether it is part of the program's
        # text: separated reasoning is not); text None: that variable is complete
        self._chunks: list[tuple[tuple[str, ...], str | None, bool]] = []
        self._finished = False
        with program.lock:
            program.states.append(self)

    # ------------------------------------------------------------------ appending
    def __iadd__(self, other: Any) -> ProgramState:
        self.submit(as_expr(other), caller_line())
        return self

    def submit(self, expr: Expr, where: str) -> None:
        items = expr.items if isinstance(expr, ExprList) else [expr]
        with self._cond:
            if self.program.interrupted:  # checked under the lock drop_pending takes
                raise ProgramError(_INTERRUPTED)
            self._pending.extend((item, where) for item in items)
            if not self._running:
                self._running = True
                threading.Thread(target=self._drain, daemon=True, name="forkserve-program").start()

    # ------------------------------------------------------------------ reading
    def sync(self, raise_error: bool = True) -> None:
        """Wait for what was appended so far. Inside the program, an operation that failed
        raises its ``ProgramError`` here (the program ends); once the program has ended,
        reads give what there is and ``error()`` says what failed, as in SGLang."""
        with self._cond:
            while (self._running or (not self._finished and self.program.read_waits_for_the_end())) \
                    and not self.program.interrupted:
                self._wait()
            ended = self._finished
        if raise_error and not ended and self.program.interrupted:
            raise ProgramError(_INTERRUPTED)
        if raise_error and self._error is not None and not ended:
            raise self._error

    def error(self) -> BaseException | None:
        self.sync(raise_error=False)
        return self._error

    def text(self) -> str:
        self.sync()
        return self.text_

    def __getitem__(self, name: str) -> Any:
        self.sync()
        if name not in self.variables:
            failed = f"; the program failed: {self._error}" if self._error is not None else ""
            raise KeyError(f"no variable {name!r} in this program state (have: {sorted(self.variables)}){failed}")
        return self.variables[name]

    def get_var(self, name: str) -> Any:
        return self[name]

    def set_var(self, name: str, value: Any) -> None:
        self.sync()
        self._store(name, value)

    def __setitem__(self, name: str, value: Any) -> None:
        """``s["name"] = value``: a program stores a computed value as a variable."""
        self.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        self.sync()
        return self.meta_info.get(name)

    def messages(self) -> list[dict[str, Any]]:
        """The chat so far; each turn's content without leading spaces, as SGLang gives it
        (the program's text, and what is rendered from the turns, keep them)."""
        self.sync()
        return [{**m, "content": m["content"].lstrip()} if isinstance(m.get("content"), str) else dict(m)
                for m in self.messages_]

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.variables

    def __repr__(self) -> str:
        self.sync(raise_error=False)
        return f"ProgramState({self.text_})"  # SGLang's form; programs slice it

    # ------------------------------------------------------------------ forking
    def fork(self, size: int = 1, position_ids_offset: list[int] | None = None) -> ProgramStateGroup:
        """``size`` copies that continue independently. The shared text is prefilled once
        first, so every branch reuses it from the cache. (SGLang's ``position_ids_offset``
        is taken only as None: positions here always follow the text.)"""
        if position_ids_offset is not None:
            raise ValueError("fork(): position_ids_offset is not supported (positions follow the text)")
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"fork(): size must be a positive integer, got {size!r}")
        self.sync()
        if size > 1 and self.text_ and self.program.backend.can_cache_prefix:
            try:
                self.program.backend.cache_prefix(self.text_, self.program.program_id)
            except Exception as err:
                raise ProgramError(f"fork({size}) at {caller_line()} failed: {err}") from err
        return ProgramStateGroup([ProgramState(self.program, parent=self) for _ in range(size)], self)

    @contextlib.contextmanager
    def copy(self, position_ids_offset: list[int] | None = None) -> Iterator[ProgramState]:
        """``with s.copy() as t: t += ...``: a branch of this state (``fork(1)``) that is
        joined back when the block ends, as SGLang's."""
        group = self.fork(1, position_ids_offset)
        try:
            yield group[0]
        except BaseException:
            with contextlib.suppress(ProgramError):  # the block's own exception is the one to see
                group.join()
            raise
        group.join()

    # ------------------------------------------------------------------ queue
    def drop_pending(self) -> None:
        with self._cond:
            self._pending.clear()
            self._cond.notify_all()

    # ------------------------------------------------------------------ executor
    def _drain(self) -> None:
        while True:
            with self._cond:
                if not self._pending:
                    self._running = False
                    self._cond.notify_all()
                    return
                expr, where = self._pending.popleft()
            if self._error is not None or self.program.interrupted:
                continue  # an earlier operation failed, or Ctrl-C: the rest of the program is skipped
            try:
                self._execute(expr)
            except Exception as err:
                self._error = ProgramError(f"{expr.describe()} at {where} failed: {err}")
                self._error.__cause__ = err
                if not self.program.interrupted:  # after Ctrl-C a gen cut short is expected, not news
                    logger.warning("%s", self._error)  # as SGLang warns: the program ends, run() does not raise

    def _append(self, text: str, var: str | None = None) -> None:
        self.text_ += text
        self._emit(var, text)

    def _execute(self, expr: Expr) -> None:
        if isinstance(expr, Constant):
            self._append(expr.text)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            decision, meta = select_choice(self.program.backend, self.text_, expr.choices, self.program.program_id,
                                           expr.choices_method)
            reasoning, decision = self._split_reasoning(expr, decision)
            self._append(decision, expr.name)
            self._store_output(expr, decision, reasoning, meta, streamed_reasoning=reasoning)
        elif isinstance(expr, RoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, RoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, ToolResult):
            self._tool_result(expr)
        elif isinstance(expr, VarScope):
            if expr.begin:
                self.scope_starts[expr.name] = len(self.text_)
            else:
                self._store(expr.name, self.text_[self.scope_starts.pop(expr.name) :])
        else:
            raise TypeError(f"unknown expression {expr!r}")

    def _gen(self, expr: Gen) -> None:
        defaults = self.program.defaults
        params = {k: v for k, v in defaults["sampling"].items() if v is not None}
        params.update({k: v for k, v in expr.sampling.items() if v is not None})
        if expr.tools is not None or has_tool_turns(self.messages_):
            if params.get("n", 1) > 1:
                raise ValueError("more than one sample (gen(n=...) or run(n=...)) cannot be part of a chat with tools")
            if expr.reasoning is not None:
                raise ValueError("separate_reasoning(): a gen after tool turns is a chat turn; the server's "
                                 "--reasoning-parser splits its reasoning")
            self._chat_gen(expr, params)
            return
        opts = {
            k: (getattr(expr, k) if getattr(expr, k) is not None else defaults[k])
            for k in ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")
        }
        backend, pid = self.program.backend, self.program.program_id
        if params.get("n", 1) > 1:  # n samples of one request: the variable holds all, the text the first
            outs = backend.generate(self.text_, params, program_id=pid, **opts)
            assert isinstance(outs, list)
            parts = [self._split_reasoning(expr, o["text"]) for o in outs]
            self._append(parts[0][1], expr.name)
            self._store_output(expr, [c for _, c in parts], [r for r, _ in parts], [o["meta_info"] for o in outs],
                               streamed_reasoning=parts[0][0])
            return
        if self.program.stream and not opts["return_logprob"]:
            out: dict[str, Any] = {"text": ""}
            shown = 0
            split = StreamingReasoning(REASONING_PARSERS[expr.reasoning]) if expr.reasoning else None
            if expr.name:  # a name used again: not the earlier gen's meta info while this one runs
                self.meta_info.pop(expr.name, None)
            try:
                for out in backend.generate_stream(self.text_, params, program_id=pid):
                    if expr.name:  # what text_async_iter(return_meta_data=True) gives with each chunk
                        self.meta_info[expr.name] = out.get("meta_info")
                    if split is None:
                        self._emit(expr.name, out["text"][shown:])
                        shown = max(shown, len(out["text"]))
                    else:
                        self._emit_split(expr, split, out["text"], finished=False)
            finally:  # a stream cut off (the server gone) keeps the text its reader was shown
                if split is not None:  # what it held back goes out, so the reader sees what is kept
                    self._emit_split(expr, split, out["text"], finished=True)
                reasoning, text = self._split_reasoning(expr, out["text"])
                self.text_ += text
                self._store_output(expr, text, reasoning, out.get("meta_info"), streamed_reasoning="")
            return
        out = backend.generate(self.text_, params, program_id=pid, **opts)  # type: ignore[assignment]
        reasoning, text = self._split_reasoning(expr, out["text"])
        self._append(text, expr.name)
        self._store_output(expr, text, reasoning, out.get("meta_info"), streamed_reasoning=reasoning)

    @staticmethod
    def _split_reasoning(expr: Gen | Select, text: str) -> tuple[str | None, str]:
        """(reasoning, the rest) of an output; reasoning None unless ``separate_reasoning``."""
        if expr.reasoning is None:
            return None, text
        reasoning, content, _ = REASONING_PARSERS[expr.reasoning].split(text)
        return reasoning, content

    def _emit_split(self, expr: Gen, split: StreamingReasoning, text: str, finished: bool) -> None:
        """Stream a separated gen: its reasoning under its own variable only, the rest as usual."""
        assert expr.name is not None  # separate_reasoning() requires a name
        reasoning, content = split.feed(text, finished)
        self._emit(reasoning_name(expr.name), reasoning, in_text=False)
        self._emit(expr.name, content)

    def _store_output(self, expr: Gen | Select, value: Any, reasoning: Any, meta: Any,
                      streamed_reasoning: str | None) -> None:
        """Set the output's variables; ``streamed_reasoning``: the reasoning still to stream
        under its own variable (none where ``_emit_split`` streamed it as it came)."""
        if expr.name:
            self._store(expr.name, value, meta)
            if expr.reasoning is not None:
                self._emit(reasoning_name(expr.name), streamed_reasoning, in_text=False)
                self._store(reasoning_name(expr.name), reasoning)

    def _markers_for(self, role: str) -> list[str]:
        markers = self.program.markers
        if role not in markers:
            raise ValueError(f"the model's chat template has no {role!r} role")
        return markers[role]

    def _role_begin(self, role: str) -> None:
        if self.role is not None:
            raise ValueError(f"{role}() started inside {self.role}(); roles do not nest")
        prefix, _ = self._markers_for(role)
        if not self.messages_ and role != "system":
            default = self.program.markers.get("default_system", "")
            if default:  # what the template inserts when a chat does not start with a system turn
                self._append(default)
                sys_prefix, sys_suffix = self.program.markers.get("system", ["", ""])
                content = default.removeprefix(sys_prefix).removesuffix(sys_suffix)
                self.messages_.append({"role": "system", "content": content})
                self.implicit_system = True
        self._append(prefix)
        self.role, self.role_start = role, len(self.text_)

    def _role_end(self, role: str) -> None:
        if self.role != role:
            raise ValueError(f"{role}() ended while in {self.role or 'no'} role")
        _, suffix = self._markers_for(role)
        message: dict[str, Any] = {"role": role, "content": self.text_[self.role_start :]}
        if self.turn_calls is not None:  # the turn was a gen with tools: its content and calls
            content, calls, end = self.turn_calls
            self.turn_calls = None
            if len(self.text_) != end:
                raise ValueError("a gen with tools is a whole assistant turn: nothing may follow it in the turn")
            message = {"role": role, "content": content}
            if calls:
                message["tool_calls"] = [c.as_openai() for c in calls]
        self._append(suffix)
        self.messages_.append(message)
        self.role = None
