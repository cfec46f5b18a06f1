"""A JSON schema as llguidance's grammar, and whether llguidance can keep it: what the HTTP
side checks (``spec.check_spec``) and the llguidance backend compiles, with no tokenizer."""

from __future__ import annotations

import json
from typing import Any

from runtime.constrained.schema_support import SUBSCHEMA, SUBSCHEMA_LISTS, SUBSCHEMA_MAPS

# Compact JSON with a space after separators, no free whitespace (see xgrammar_backend).
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_grammar(schema_text: str) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(closed(json.loads(schema_text)), defaults=_JSON_OPTIONS)


def closed(schema: Any, in_all_of: bool = False) -> Any:
    """``schema`` with xgrammar's defaults made explicit, so a schema means the same on both
    engines: an object with ``properties`` takes no others unless it says so, an array with
    ``prefixItems`` no more items. Not inside ``allOf`` (each part there sees the whole
    object: closing one would refuse the others' properties)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if not in_all_of and "properties" in out and not {"additionalProperties", "patternProperties",
                                                      "unevaluatedProperties"} & out.keys():
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


def llguidance_refusal(schema_text: str) -> str | None:
    """Why llguidance cannot enforce the schema (its message's first line), or None."""
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(json_grammar(schema_text))
    if is_error:
        return (messages[0].strip().splitlines() or ["the schema is refused"])[0]
    return None
