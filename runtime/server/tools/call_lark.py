"""The tool-call grammar in llguidance's Lark dialect, for the requests whose schemas xgrammar
would not enforce whole (a ``strict`` tool's or the ``response_format``'s, ``schema_support``):
the same rules as ``constraint.tool_grammar`` writes for xgrammar, with each schema inline as
``%json``. Free text in ``auto`` runs up to the first trigger (a lazy lexeme: it ends where
the trigger is first complete), after which a call of an allowed tool must follow."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from runtime.constrained.llguidance_grammar import lark_json

if TYPE_CHECKING:
    from runtime.server.tools.constraint import CallMarkup


def _lit(text: str) -> str:
    return json.dumps(text)  # a Lark string literal


def _json_call(markup: CallMarkup, name: str, schema: Any) -> str | None:
    """A call written as a JSON object (``{"name": N, "parameters": {...}}``) as one ``%json``,
    or None for other markups. Beside an answer schema's ``%json`` a call spelt as literal text
    would never be reached: llguidance picks one lexer at the shared ``{``; two ``%json`` merge."""
    key = re.fullmatch(r'\{\{"name": "\{name\}", "(\w+)": ', markup.item_begin)
    if key is None or markup.item_end != "}":
        return None
    call = {"type": "object", "properties": {"name": {"const": name}, key[1]: schema}, "required": ["name", key[1]]}
    return lark_json(call)


def call_lark(markup: CallMarkup, functions: list[tuple[str, Any]], mode: str, parallel: bool,
              answer_schema: Any = None) -> str:
    """``mode`` is ``required`` or ``auto`` (``constraint.tool_grammar`` handles ``none``)."""
    rules = ["%llguidance {}"]
    args = [f"args_{i}: {lark_json(schema)}" for i, (_, schema) in enumerate(functions)]
    if mode == "auto" and answer_schema is None:
        rules += args
        # Text, then (at the trigger) a call, as often as parallel calls allow.
        rules += ["TEXT: /(.|\\n)*/", f"trigger[lazy]: TEXT {_lit(markup.trigger)}"]
        for i, (name, _) in enumerate(functions):
            begin = markup.begin.format(name=name)
            assert begin.startswith(markup.trigger)
            rules.append(f"tag_{i}: {_lit(begin[len(markup.trigger):])} args_{i} {_lit(markup.end)}")
        tags = " | ".join(f"tag_{i}" for i in range(len(functions)))
        start = f"(trigger ({tags}))* TEXT" if parallel else f"TEXT | trigger ({tags})"
    else:
        # A block of calls; in auto with an answer schema, or one JSON value of that schema.
        for i, (name, schema) in enumerate(functions):
            call = _json_call(markup, name, schema)
            if call is None:  # literal text around the arguments
                rules.append(args[i])
                call = f"{_lit(markup.item_begin.format(name=name))} args_{i} {_lit(markup.item_end)}"
            rules.append(f"call_{i}: {call}")
        rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(functions))))
        calls = f"call ({_lit(markup.separator)} call)*" if parallel else "call"
        start = " ".join(part for part in (markup.prefix and _lit(markup.prefix), calls,
                                           markup.suffix and _lit(markup.suffix)) if part)
        if mode == "auto":
            rules.append(f"answer: {lark_json(answer_schema)}")
            start = f"{start} | answer"
    rules.append(f"start: {start}")
    return "\n".join(rules) + "\n"
