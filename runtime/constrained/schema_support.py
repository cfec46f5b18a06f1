"""Which JSON schemas xgrammar enforces whole. It compiles some keywords without enforcing
them (it may only print a warning): output under such a schema could break it while the
request reports success. ``unhonoured_feature`` finds them first; such a schema compiles
with llguidance instead (``auto_backend``), or is refused with the part's place in the
schema when llguidance cannot keep it either. ``enforceable_part`` is the looser schema
xgrammar does enforce (for tools that were promised nothing more).

Found by compiling a schema with each keyword and checking a violating instance against the
grammar (xgrammar 0.2.9); ``tests/test_schema_support.py`` keeps the list honest both ways:
every part found is still let through by xgrammar, and every part accepted still enforced.
"""

from __future__ import annotations

from typing import Any

try:  # Python 3.11+
    import re._parser as _sre  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre  # type: ignore[no-redef]

# Keywords whose constraint the engine drops.
IGNORED_KEYWORDS = ("uniqueItems", "contains", "minContains", "maxContains", "dependentRequired",
                    "dependentSchemas", "dependencies", "not", "if", "then", "else")

# Keywords that constrain nothing (annotations, definitions): beside anything.
ANNOTATIONS = frozenset(["title", "description", "default", "examples", "example", "$schema", "$id", "$comment",
                         "$defs", "definitions", "deprecated", "readOnly", "writeOnly", "$anchor", "discriminator"])
# Keywords beside which xgrammar drops every other constraint of the same schema.
EXCLUSIVE = ("allOf", "anyOf", "oneOf", "$ref")

# Subschemas by keyword: a schema, a list of schemas, or a mapping of names to schemas.
SUBSCHEMA = ("items", "additionalProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems")
SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")

# Characters a JSON string can hold only escaped: xgrammar keeps a pattern's matches to
# strings without them, and when no such string matches it writes them unescaped.
_NEEDS_ESCAPE = frozenset([*range(0x20), ord('"'), ord("\\")])


def unhonoured_feature(schema: Any) -> str | None:
    """A sentence naming the first part of ``schema`` the engine would not enforce (with its
    JSON path: ``properties.tag.pattern``), or None when every part is enforced."""
    problems = enforceable_part(schema)[1]
    return problems[0] if problems else None


def enforceable_part(schema: Any, path: str = "") -> tuple[Any, list[str]]:
    """``schema`` without what the engine would not enforce (a looser schema, every part of
    which is enforced), and a sentence for each part taken out, with its JSON path."""
    if not isinstance(schema, dict):
        return schema, []
    where = f" (at {path or 'the top level'})"
    kept, problems = dict(schema), []

    def drop(keys: tuple[str, ...], why: str) -> None:
        for key in keys:
            kept.pop(key, None)
        problems.append(why + where)

    for key in IGNORED_KEYWORDS:
        if key in schema and not (key == "uniqueItems" and schema[key] is False):
            drop((key,), f"'{key}' is not supported")
    for keys, why in _object_problems(schema) + _number_problems(schema):
        drop(keys, why)
    while found := _string_problems(kept):  # one at a time: a pattern with a length, then its look-around
        for keys, why in found:
            drop(keys, why)
    exclusive = next((key for key in EXCLUSIVE if key in kept), None)
    beside = sorted(k for k in kept if k not in ANNOTATIONS and k != exclusive) if exclusive else []
    if beside:  # (dropped: what xgrammar enforces is the combinator alone)
        drop(tuple(beside), f"keywords beside '{exclusive}' ({', '.join(beside)}) are not supported")
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        drop(("allOf",), "'allOf' with more than one schema is not supported")
    ref = schema.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        drop(("$ref",), f"'$ref' to another document ({ref!r}) is not supported, only '#/...' within the schema")
    if isinstance(kept.get("required"), list):  # names the engine cannot make are left out
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        kept["required"] = [name for name in schema["required"] if isinstance(name, str) and name in properties]
    prefix = f"{path}." if path else ""
    for key in SUBSCHEMA:
        if key in kept:
            sub = kept[key]
            if key == "propertyNames" and isinstance(sub, dict) and "type" not in sub:
                sub = {"type": "string", **sub}  # names are strings: the engine knows it there
            kept[key], found = enforceable_part(sub, prefix + key)
            problems += found
    for key in SUBSCHEMA_LISTS:
        if isinstance(kept.get(key), list):
            subs = [enforceable_part(sub, f"{prefix}{key}[{i}]") for i, sub in enumerate(kept[key])]
            kept[key] = [sub for sub, _ in subs]
            problems += [p for _, found in subs for p in found]
    for key in SUBSCHEMA_MAPS:
        if isinstance(kept.get(key), dict):
            subs = {name: enforceable_part(sub, f"{prefix}{key}.{name}") for name, sub in kept[key].items()}
            kept[key] = {name: sub for name, (sub, _) in subs.items()}
            problems += [p for _, found in subs.values() for p in found]
    return kept, problems


Problem = tuple[tuple[str, ...], str]  # (keywords to take out, why)


# Formats xgrammar writes a grammar for; beside one of these it drops lengths and patterns.
# Any other format it ignores (JSON Schema makes formats annotations) and keeps the rest.
KNOWN_FORMATS = frozenset(["email", "uri", "uri-reference", "uri-template", "date", "time", "date-time", "duration",
                           "ipv4", "ipv6", "hostname", "uuid", "json-pointer", "relative-json-pointer"])
_FORMATS_WITH_EMPTY = frozenset(["uri-reference", "uri-template", "json-pointer", "relative-json-pointer"])
# Keywords of one type that xgrammar enforces only with a "type" beside them.
_TYPED_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
                   "maxLength", "pattern", "format", "minItems", "maxItems")


def _string_problems(schema: dict[str, Any]) -> list[Problem]:
    untyped = [k for k in _TYPED_KEYWORDS if k in schema] if "type" not in schema else []
    if untyped:
        return [(tuple(untyped), f"'{untyped[0]}' without a 'type' beside it is not supported")]
    pattern, fmt = schema.get("pattern"), schema.get("format")
    min_length = schema.get("minLength")
    lengths = tuple(k for k in ("minLength", "maxLength") if k in schema)
    if fmt in KNOWN_FORMATS:  # it keeps the format: a length beyond what the format implies, or a pattern, is lost
        empty_ok = fmt in _FORMATS_WITH_EMPTY
        binding = [k for k in lengths if k == "maxLength" or not isinstance(min_length, int)
                   or min_length > 1 or (min_length == 1 and empty_ok)]
        other = ("pattern",) if pattern is not None else tuple(binding)
        if other:
            return [(other, f"'format' {fmt!r} together with '{other[0]}' is not supported")]
    if pattern is not None and lengths:  # the engine keeps the pattern and drops the lengths
        return [(lengths, f"'pattern' together with '{lengths[0]}' is not supported")]
    problem = pattern_problem(pattern) if isinstance(pattern, str) else None
    return [(("pattern",), problem)] if problem else []


def _object_problems(schema: dict[str, Any]) -> list[Problem]:
    required = schema.get("required")
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    names = [name for name in required if isinstance(name, str)] if isinstance(required, list) else []
    missing = [name for name in names if name not in properties]
    if missing:  # the engine ignores the name; the looser schema leaves it out of "required"
        return [((), f"required property {missing[0]!r} is not in 'properties' (the engine cannot make it)")]
    return []


def _number_problems(schema: dict[str, Any]) -> list[Problem]:
    step, kind = schema.get("multipleOf"), schema.get("type")
    integers_only = kind == "integer" or (isinstance(kind, list) and "integer" in kind and "number" not in kind)
    if step is None or (integers_only and isinstance(step, (int, float)) and float(step).is_integer()):
        return []
    return [(("multipleOf",), "'multipleOf' is supported only on integers, by a whole number")]


_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def invalid_keyword(schema: Any, path: str = "") -> str | None:
    """A sentence naming the first keyword whose value JSON Schema does not allow, with its
    place, or None: a count (``maxLength``, ``minItems``, ...) that is not a non-negative
    integer, a ``multipleOf`` not above 0. The engines read some of these as no bound."""
    if not isinstance(schema, dict):
        return None
    where = f" (at {path or 'the top level'})"
    for key in _COUNTS:
        value = schema.get(key)
        if key in schema and not (_is_number(value) and value >= 0 and (isinstance(value, int) or value.is_integer())):
            return f"'{key}' must be a non-negative integer, got {value!r}{where}"
    step = schema.get("multipleOf")
    if "multipleOf" in schema and not (_is_number(step) and step > 0):
        return f"'multipleOf' must be a number greater than 0, got {step!r}{where}"
    prefix = f"{path}." if path else ""
    subs = [(schema[k], prefix + k) for k in SUBSCHEMA if k in schema]
    subs += [(sub, f"{prefix}{k}[{i}]") for k in SUBSCHEMA_LISTS if isinstance(schema.get(k), list)
             for i, sub in enumerate(schema[k])]
    subs += [(sub, f"{prefix}{k}.{name}") for k in SUBSCHEMA_MAPS if isinstance(schema.get(k), dict)
             for name, sub in schema[k].items()]
    return next((found for sub, at in subs if (found := invalid_keyword(sub, at)) is not None), None)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def pattern_problem(pattern: str) -> str | None:
    """Why a JSON string ``pattern`` cannot be kept, or None: look-around (the engine drops
    it), or no match without a quote, backslash or control character (the engine would write
    those unescaped, breaking the JSON). A pattern Python cannot parse is left to the engine,
    whose own error names it."""
    try:
        tree = _sre.parse(pattern)
    except Exception:  # noqa: BLE001 - ECMA syntax Python lacks: the engine judges it
        return None
    if _has_lookaround(tree):
        return f"look-around in 'pattern' {pattern!r} is not supported"
    if not _matches_escape_free(tree):
        return (f"'pattern' {pattern!r} matches only strings with a quote, backslash or control character, "
                "which this server cannot write into JSON strings")
    return None


def _children(op: Any, av: Any) -> list[Any]:
    """The sub-sequences of one parsed regex node."""
    name = str(op)
    if name == "BRANCH":
        return list(av[1])
    if name == "SUBPATTERN":
        return [av[3]]
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        return [av[2]]
    if name in ("ASSERT", "ASSERT_NOT"):
        return [av[1]]
    if name == "ATOMIC_GROUP":
        return [av]
    if name == "GROUPREF_EXISTS":
        return [seq for seq in av[1:] if seq is not None]
    return []


def _has_lookaround(seq: Any) -> bool:
    return any(str(op) in ("ASSERT", "ASSERT_NOT") or any(_has_lookaround(s) for s in _children(op, av))
               for op, av in seq)


def _matches_escape_free(seq: Any) -> bool:
    """Whether the parsed sequence matches some string without a character needing escape."""
    return all(_node_escape_free(op, av) for op, av in seq)


def _node_escape_free(op: Any, av: Any) -> bool:
    name = str(op)
    if name == "LITERAL":
        return av not in _NEEDS_ESCAPE
    if name == "IN":
        return _class_escape_free(av)
    if name == "BRANCH":
        return any(_matches_escape_free(alt) for alt in av[1])
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        return av[0] == 0 or _matches_escape_free(av[2])
    if name in ("SUBPATTERN", "ATOMIC_GROUP"):
        return _matches_escape_free(_children(op, av)[0])
    return True  # ANY, NOT_LITERAL, anchors, categories: each admits a plain character


def _class_escape_free(items: list[Any]) -> bool:
    for op, av in items:
        name = str(op)
        if name in ("NEGATE", "CATEGORY"):  # every class of these holds a plain character
            return True
        if name == "LITERAL" and av not in _NEEDS_ESCAPE:
            return True
        if name == "RANGE" and any(c not in _NEEDS_ESCAPE for c in range(av[0], min(av[1], 0x5D) + 1)):
            return True
        if name == "RANGE" and av[1] > 0x5D:
            return True
    return False
