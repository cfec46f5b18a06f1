"""The part of ``ProgramState`` that runs chats with tools (``frontend_lang/tools.py``): a gen
with tools, or any gen after tool turns, is one whole assistant turn rendered from the
state's messages by the backend; ``tool()`` adds a call's result as a ``tool`` message."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from frontend_lang.ir import Gen, ToolResult

if TYPE_CHECKING:
    from frontend_lang.state import Program
    from frontend_lang.tools import ToolUse


class ToolTurns:
    # ProgramState's, used here
    program: Program
    text_: str
    role: str | None
    role_start: int
    messages_: list[dict[str, Any]]
    variables: dict[str, Any]
    meta_info: dict[str, Any]
    implicit_system: bool
    tools_: ToolUse | None
    turn_calls: tuple[str, list[Any], int] | None
    set_names: set[str]

    def _emit(self, var: str | None, text: str | None) -> None:
        """Stream ``text`` as part of ``var``; text None: ``var`` is complete."""
        raise NotImplementedError

    def _store(self, name: str, value: Any, meta: Any = None) -> None:
        """Set variable ``name`` (and its meta info, where given) in this state; ``join``
        gathers the names a branch set."""
        self.variables[name] = value
        if meta is not None:
            self.meta_info[name] = meta
        self.set_names.add(name)
        self._emit(name, None)

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages as a chat API client sends them (without the template's default system turn)."""
        return self.messages_[1:] if self.implicit_system else list(self.messages_)

    def _set_text(self, text: str) -> None:
        """The conversation re-rendered: streaming shows what it added, if it only added."""
        if text.startswith(self.text_):
            self._emit(None, text[len(self.text_):])
        self.text_ = text

    def _chat_gen(self, expr: Gen, params: dict[str, Any]) -> None:
        """A gen with tools, or any gen after tool turns: one whole assistant turn, rendered
        from the messages by the backend (``Backend.generate_chat``)."""
        if self.role != "assistant" or len(self.text_) != self.role_start:
            raise ValueError("a gen with tools (or after tool turns) is a whole assistant turn: "
                             "put it right at the start of assistant()")
        if expr.tools is not None:
            self.tools_ = expr.tools
        backend, out, shown = self.program.backend, {}, 0
        for k, out in enumerate(backend.generate_chat(self.chat_messages(), params, expr.tools,
                                                      program_id=self.program.program_id, stream=self.program.stream)):
            if k == 0 and out.get("prompt") is not None:  # the turn continues the rendered conversation
                self._set_text(out["prompt"])
                self.role_start = len(self.text_)
            if not out.get("final"):
                self._emit(expr.name, out["text"][shown:])
                shown = max(shown, len(out["text"]))
        self.text_ += out["text"]
        self._emit(expr.name, out["text"][shown:])
        calls = out["tool_calls"]
        self.turn_calls = (out["content"], calls, len(self.text_))
        if expr.name:
            may_call = expr.tools is not None and expr.tools.choice != "none"
            self._store(expr.name, calls if may_call else out["content"], {**out["meta_info"], "content": out["content"]})

    def _tool_result(self, expr: ToolResult) -> None:
        if self.role is not None:
            raise ValueError(f"tool() goes between turns, not inside {self.role}()")
        self.messages_.append({"role": "tool", "tool_call_id": expr.tool_call_id, "content": expr.content})
        self._set_text(self.program.backend.chat_text(self.chat_messages(), self.tools_))
