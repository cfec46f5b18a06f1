"""``tool_choice`` in each of OpenAI's chat forms, read into one rule: whether the answer may
not, may, or must hold calls, and which of the request's tools it may call.

- ``"none"`` / ``"auto"`` / ``"required"`` (unset: ``auto`` with tools, ``none`` without);
- ``{"type": "function", "function": {"name": N}}``: must call N, exactly once (OpenAI's
  "forced function");
- ``{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools": [...]}}``
  with ``tools`` of the form ``{"type": "function", "function": {"name": N}}``: calls only
  of those tools. Every tool stays in the prompt, so a program that narrows its tools from
  step to step keeps one prompt prefix (and its cached KV) across those steps.

The Responses API's forms are turned into these by ``responses_input.chat_tool_choice``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from runtime.sampling.params import InvalidField

Mode = Literal["none", "auto", "required"]
_MODES: tuple[Mode, ...] = ("none", "auto", "required")
_FORMS = ('"none", "auto", "required", {"type": "function", "function": {"name": ...}} or '
          '{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools": [...]}}')


@dataclass(frozen=True)
class CallRule:
    mode: Mode
    names: tuple[str, ...]  # the tools the answer may call, in the request's order
    single: bool = False  # one call at most (a named function), whatever parallel_tool_calls says


def _named(entry: Any) -> str | None:
    """N of ``{"type": "function", "function": {"name": N}}``, else None."""
    if isinstance(entry, dict) and entry.get("type") == "function" and isinstance(entry.get("function"), dict):
        name = entry["function"].get("name")
        return name if isinstance(name, str) else None
    return None


def call_rule(tools: list[dict[str, Any]] | None, choice: Any) -> CallRule:
    """The rule for ``choice`` over ``tools`` (OpenAI's function tools); ``InvalidField``
    naming ``tool_choice`` where it is malformed or names a tool the request does not give."""
    given = tuple(t["function"]["name"] for t in tools or ())
    if choice is None or choice == "auto" and not given:  # "auto" over no tools (clients send it): no calls
        return CallRule("auto" if given else "none", given)
    if isinstance(choice, str):
        if choice not in _MODES:
            raise InvalidField("tool_choice", f"tool_choice must be one of {_FORMS}, got {choice!r}")
        if choice == "required" and not given:
            raise InvalidField("tool_choice", "tool_choice 'required' needs 'tools'")
        return CallRule(choice, given)  # type: ignore[arg-type]
    if not isinstance(choice, dict):
        raise InvalidField("tool_choice", f"tool_choice must be one of {_FORMS}, got {choice!r}")
    if not given:
        raise InvalidField("tool_choice", f"tool_choice {choice!r} needs 'tools'")
    if choice.get("type") == "allowed_tools":
        allowed = choice.get("allowed_tools")
        entries = allowed.get("tools") if isinstance(allowed, dict) else None
        mode = allowed.get("mode") if isinstance(allowed, dict) else None
        if mode not in ("auto", "required") or not isinstance(entries, list) or not entries:
            raise InvalidField("tool_choice", 'allowed_tools needs "mode" ("auto" or "required") and a non-empty '
                                              '"tools" list')
        names = []
        for entry in entries:
            name = _named(entry)
            if name is None:
                raise InvalidField("tool_choice", 'each of allowed_tools.tools must be {"type": "function", '
                                                  f'"function": {{"name": ...}}}}, got {entry!r}')
            if name not in given:
                raise InvalidField("tool_choice", f"allowed_tools names '{name}', which is not one of the given tools")
            names.append(name)
        return CallRule(mode, tuple(n for n in given if n in names))
    name = _named(choice)
    if name is None:
        raise InvalidField("tool_choice", f"tool_choice must be one of {_FORMS}, got {choice!r}")
    if name not in given:
        raise InvalidField("tool_choice", f"tool_choice names '{name}', which is not one of the given tools")
    return CallRule("required", (name,), single=True)
