"""llguidance's grammars, and whether llguidance can keep them: what the HTTP side checks
(``spec.check_spec``) and the llguidance backend compiles, with no tokenizer. Two sources: a
JSON schema, and a Lark grammar (llguidance's dialect, with ``%json { schema }`` inline: the
tool-call grammars ``server/tools/call_lark.py`` writes, and a client's ``ebnf``)."""

from __future__ import annotations

import json
from typing import Any

from runtime.constrained.schema_support import (
    KNOWN_FORMATS,
    SUBSCHEMA,
    SUBSCHEMA_LISTS,
    SUBSCHEMA_MAPS,
)

# Compact JSON with a space after separators, no free whitespace (see xgrammar_backend).
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_grammar(schema_text: str) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(closed(json.loads(schema_text)), defaults=_JSON_OPTIONS)


def lark_grammar(text: str) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_lark(text)


def lark_json(schema: Any) -> str:
    """``%json { ... }`` of ``schema`` inside a Lark grammar, written as ``json_grammar`` writes."""
    schema = {} if schema is True else schema
    return "%json " + json.dumps({**closed(schema), "x-guidance": _JSON_OPTIONS})


def closed(schema: Any, in_all_of: bool = False) -> Any:
    """``schema`` with xgrammar's defaults made explicit, so a schema means the same on both
    engines: an object with ``properties`` (its own or its ``allOf`` parts') takes no others
    unless it says so, an array with ``prefixItems`` no more items. The parts of an ``allOf``
    are left open (each sees the whole object: closing one would refuse the others'). A
    ``format`` xgrammar ignores (an annotation, as JSON Schema has it) is left out: llguidance
    would refuse those it does not know."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("format"), str) and out["format"] not in KNOWN_FORMATS:
        del out["format"]
    parts = [p for p in out["allOf"] if isinstance(p, dict)] if isinstance(out.get("allOf"), list) else []
    names = [n for p in [out, *parts] if isinstance(p.get("properties"), dict) for n in p["properties"]]
    if not in_all_of and names and not {"additionalProperties", "patternProperties", "unevaluatedProperties"} & out.keys():
        # Closed to its own properties and its allOf parts' (listed here as any value: the
        # parts keep their own schemas for them), as xgrammar closes an object.
        out["properties"] = {**dict.fromkeys(names, {}), **(out.get("properties") or {})}
        out["additionalProperties"] = False
    if not in_all_of and "prefixItems" in out and not {"items", "unevaluatedItems"} & out.keys():
        out["items"] = False
    for key in SUBSCHEMA:
        if key in out:
            out[key] = closed(out[key])
    for key in SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(sub, in_all_of=key == "allOf") for sub in out[key]]
    for key in SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    return out


def llguidance_refusal(grammar: str) -> str | None:
    """Why llguidance cannot enforce ``grammar`` (a ``json_grammar`` or ``lark_grammar``), or None."""
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if not is_error:
        return None
    lines = [line.strip() for line in messages[0].splitlines() if line.strip()] or ["the schema is refused"]
    # A regex error is a header, the pattern with a caret, and "error: why" last.
    reason = next((line for line in lines[1:] if line.startswith("error:")), "")
    return f"{lines[0]} {reason.removeprefix('error: ')}".strip()
