"""The grammar that keeps a model's tool calls valid, as EBNF text for the ``ebnf`` sampling
field: ``tool_choice`` ``required`` or a named function -> exactly one call of the allowed
tools, its arguments matching the tool's JSON schema; ``auto`` -> free text in which any
call the model starts (at the format's trigger) must complete validly (xgrammar's
structural tags)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallMarkup:
    """How a format writes one call: ``begin(name)`` + arguments JSON + ``end``."""

    trigger: str
    begin: str  # with {name}
    end: str


MARKUP = {
    "hermes": CallMarkup("<tool_call>", '<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>"),
    "qwen25": CallMarkup("<tool_call>", '<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>"),
    "llama3_json": CallMarkup('{"name": ', '{{"name": "{name}", "parameters": ', "}"),
    "mistral": CallMarkup("[TOOL_CALLS]", '[TOOL_CALLS] [{{"name": "{name}", "arguments": ', "}]"),
}


def _functions(tools: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for t in tools:
        fn = t.get("function") or {}
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        out.append((fn["name"], params))
    return out


def tool_grammar(tools: list[dict[str, Any]], tool_choice: Any, parser_name: str) -> str | None:
    """EBNF text, or None when nothing is enforced (``tool_choice`` ``none``)."""
    import xgrammar as xgr

    markup = MARKUP[parser_name]
    functions = _functions(tools)
    if tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        wanted = (tool_choice.get("function") or {}).get("name")
        functions = [(n, p) for n, p in functions if n == wanted]
    if tool_choice in (None, "auto"):
        tags = [xgr.StructuralTagItem(begin=markup.begin.format(name=n), schema=json.dumps(p), end=markup.end)
                for n, p in functions]
        return str(xgr.Grammar.from_structural_tag(tags, [markup.trigger]))
    calls = [
        xgr.Grammar.concat(
            xgr.Grammar.from_ebnf(f"root ::= {json.dumps(markup.begin.format(name=n))}"),
            xgr.Grammar.from_json_schema(json.dumps(p), any_whitespace=False),
            xgr.Grammar.from_ebnf(f"root ::= {json.dumps(markup.end)}"),
        )
        for n, p in functions
    ]
    return str(calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls))
