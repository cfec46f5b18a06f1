"""The grammar that keeps a model's tool calls valid, as text for the ``ebnf`` sampling field:
xgrammar's EBNF built from its structural tags, or, where a schema has a part xgrammar would
not enforce, llguidance's Lark (``call_lark``):
- ``tool_choice`` ``required`` (a named function, ``allowed_tools`` in mode ``required``):
  nothing but calls of the allowed tools, at least one (a named function: exactly one),
  each one's arguments matching its tool's JSON schema;
- ``auto`` (``allowed_tools`` in mode ``auto``): free text in which any call the model starts
  (at the format's trigger) must complete validly, as a call of an allowed tool.
With ``parallel_tool_calls: false`` the output ends after its first call. With an
``answer_schema`` (the request's JSON ``response_format``), ``auto`` is instead either calls
(as for ``required``) or one JSON value of that schema: the answer that does not call a tool
is the structured one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.constrained.schema_support import enforceable_part, invalid_keyword, unhonoured_feature
from runtime.constrained.spec import engine_message, json_schema_error
from runtime.sampling.params import InvalidField
from runtime.server.tools.call_lark import call_lark
from runtime.server.tools.choice import call_rule


@dataclass(frozen=True)
class CallMarkup:
    """How a format writes its calls. A block of several calls is ``prefix``, then each call
    as ``item_begin(name)`` + arguments JSON + ``item_end``, joined by ``separator``, then
    ``suffix``; a call on its own inside free text (``auto``) is ``begin(name)`` + arguments
    + ``end``, opened by ``trigger``."""

    trigger: str
    begin: str  # with {name}
    end: str
    item_begin: str  # with {name}
    item_end: str
    separator: str
    prefix: str = ""
    suffix: str = ""


_HERMES = CallMarkup("<tool_call>", '<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>",
                     '<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>", "\n")
MARKUP = {
    "hermes": _HERMES,
    "qwen25": _HERMES,
    "llama3_json": CallMarkup('{"name": ', '{{"name": "{name}", "parameters": ', "}",
                              '{{"name": "{name}", "parameters": ', "}", "; "),
    "mistral": CallMarkup("[TOOL_CALLS]", '[TOOL_CALLS] [{{"name": "{name}", "arguments": ', "}]",
                          '{{"name": "{name}", "arguments": ', "}", ", ", prefix="[TOOL_CALLS] [", suffix="]"),
}

# Whitespace the arguments JSON may have in a row: enough for "a": 1, and no runs of newlines
# from a small model that cannot decide what comes next.
_MAX_WHITESPACE = 1


Function = tuple[str, dict[str, Any], bool]  # name, parameters schema, strict


def _functions(tools: list[dict[str, Any]]) -> list[Function]:
    """(name, parameters schema, strict) of each tool. A ``strict`` tool's schema is enforced whole
    (by llguidance where xgrammar would not: ``call_lark``; a 400 where neither can, as
    OpenAI answers a strict schema it cannot keep); another's calls follow the part of it
    xgrammar enforces (``enforceable_part``): nothing promised them more, and refusing a
    request over one tool's ``uniqueItems`` would fail clients that send their functions'
    generated schemas with every call. A schema with a value JSON Schema forbids
    (``invalid_keyword``) is refused either way: it is not a schema."""
    out = []
    for t in tools:
        fn = t.get("function") or {}
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        invalid = invalid_keyword(params)
        if invalid is not None:
            raise InvalidField("tools", f"the parameters of tool '{fn['name']}' are not a valid JSON Schema: {invalid}")
        kinds = params.get("type", "object") if isinstance(params, dict) else "object"
        if "object" not in (kinds if isinstance(kinds, list) else [kinds]):  # as OpenAI answers it
            raise InvalidField("tools", f"the parameters of tool '{fn['name']}' must be a JSON Schema of type 'object' "
                                        f"(a call's arguments are a JSON object), got type {kinds!r}")
        strict = bool(fn.get("strict"))
        out.append((fn["name"], params if strict else enforceable_part(params)[0], strict))
    return out


def _lark_tool_grammar(markup: CallMarkup, functions: list[Function], mode: str,
                       parallel: bool, answer_schema: dict[str, Any] | None) -> str:
    """The grammar for llguidance (``call_lark``), or a 400 naming the schema it refuses."""
    from runtime.constrained.llguidance_grammar import lark_grammar, llguidance_refusal

    text = call_lark(markup, [(name, schema) for name, schema, _ in functions], mode, parallel, answer_schema)
    refusal = llguidance_refusal(lark_grammar(text))
    if refusal is None:
        return text
    raise _schema_at_fault(functions, mode, answer_schema) or \
        InvalidField("tools", f"the tools' call grammar cannot be compiled: {refusal}")


def _schema_at_fault(functions: list[Function], mode: str, answer_schema: dict[str, Any] | None) -> InvalidField | None:
    """The 400 naming the first schema of a call grammar an engine refused that cannot be a
    constraint on its own (``spec.json_schema_error``), or None: the grammar as a whole is."""
    named = [("tools", f"the parameters of {'strict ' * strict}tool '{name}'", schema, strict)
             for name, schema, strict in functions]
    if mode == "auto" and answer_schema is not None:
        named.append(("response_format", "the response_format schema", answer_schema, False))
    for field, what, schema, strict in named:
        why = json_schema_error(schema)
        if why is not None:
            # a part only llguidance would keep: without strict, xgrammar keeps the rest
            hint = "; without 'strict' its calls follow the rest of the schema" \
                if strict and why.startswith("cannot be enforced") else ""
            return InvalidField(field, f"{what} {why}{hint}")
    return None


def tool_grammar(tools: list[dict[str, Any]], tool_choice: Any, parser_name: str, parallel: bool = True,
                 answer_schema: dict[str, Any] | None = None, lark: bool = False) -> str | None:
    """Grammar text, or None when nothing is enforced (``tool_choice`` ``none``). ``lark``:
    llguidance's Lark even where xgrammar's EBNF would do (tests hold both to the same rules)."""
    import xgrammar as xgr
    from xgrammar import structural_tag as st

    markup = MARKUP[parser_name]
    rule = call_rule(tools, tool_choice)
    if rule.mode == "none":
        return None
    functions = _functions([t for t in tools if (t.get("function") or {}).get("name") in rule.names])
    parallel = parallel and not rule.single
    invalid = invalid_keyword(answer_schema)
    if invalid is not None:
        raise InvalidField("response_format", f"the response_format schema is not a valid JSON Schema: {invalid}")
    if lark or any(unhonoured_feature(schema) for _, schema, _ in functions) or (
            rule.mode == "auto" and unhonoured_feature(answer_schema)):
        return _lark_tool_grammar(markup, functions, rule.mode, parallel, answer_schema)

    def tag(begin: str, end: str, name: str, schema: dict[str, Any]) -> Any:
        args = st.JSONSchemaFormat(json_schema=schema, max_whitespace_cnt=_MAX_WHITESPACE)
        return st.TagFormat(begin=begin.format(name=name), content=args, end=end)

    fmt: Any = st.TagsWithSeparatorFormat(
        tags=[tag(markup.item_begin, markup.item_end, n, p) for n, p, _ in functions], separator=markup.separator,
        at_least_one=True, stop_after_first=not parallel,
    )
    if markup.prefix or markup.suffix:
        fmt = st.SequenceFormat(elements=[st.ConstStringFormat(value=markup.prefix), fmt,
                                          st.ConstStringFormat(value=markup.suffix)])
    if rule.mode == "auto" and answer_schema is not None:
        fmt = st.OrFormat(elements=[fmt, st.JSONSchemaFormat(json_schema=answer_schema,
                                                             max_whitespace_cnt=_MAX_WHITESPACE)])
    elif rule.mode == "auto":
        fmt = st.TriggeredTagsFormat(
            triggers=[markup.trigger], tags=[tag(markup.begin, markup.end, n, p) for n, p, _ in functions],
            stop_after_first=not parallel,
        )
    try:
        return str(xgr.Grammar.from_structural_tag(st.StructuralTag(format=fmt)))
    except Exception as err:  # the engine's RuntimeError: find the schema that caused it
        raise _schema_at_fault(functions, rule.mode, answer_schema) or \
            InvalidField("tools", f"the tools' call grammar cannot be compiled: {engine_message(err)}") from err
