"""Which constraint a request carries, and a syntax check that needs no tokenizer."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from runtime.constrained.finite_output import unending_rules
from runtime.constrained.schema_support import enforceable_part, invalid_keyword
from runtime.sampling.params import InvalidField

Kind = Literal["regex", "json_schema", "ebnf"]
KINDS: tuple[Kind, ...] = ("regex", "json_schema", "ebnf")


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint as the user gave it: ``kind`` is the sampling field's name, ``text`` its
    value (a JSON schema as a JSON string). Hashable: compiled grammars are cached by it."""

    kind: Kind
    text: str


def is_lark(spec: GrammarSpec) -> bool:
    """An ``ebnf`` written in llguidance's Lark dialect: one that starts with ``%llguidance``
    (how SGLang's llguidance backend and llama.cpp tell one apart) or has no ``::=`` rule at
    all (vLLM reads such a grammar as Lark). Compiled by llguidance; other EBNF by xgrammar."""
    return spec.kind == "ebnf" and (spec.text.lstrip().startswith("%llguidance") or "::=" not in spec.text)


def spec_of(params: Any) -> GrammarSpec | None:
    """The request's constraint, or None. ``params`` has ``regex``, ``json_schema``, ``ebnf``."""
    given = [(k, getattr(params, k)) for k in KINDS if getattr(params, k) is not None]
    if not given:
        return None
    if len(given) > 1:
        names = " and ".join(k for k, _ in given)
        raise InvalidField(given[1][0], f"give at most one of regex, json_schema and ebnf, not {names}")
    kind, text = given[0]
    if not isinstance(text, str) or not text:
        raise InvalidField(kind, f"{kind} must be a non-empty string, got {text!r}")
    return GrammarSpec(kind, text)


def check_constraint(params: Any) -> None:
    """``check_spec`` of the request's constraint, if it has one."""
    spec = spec_of(params)
    if spec is not None:
        check_spec(spec)


@lru_cache(maxsize=256)
def check_spec(spec: GrammarSpec) -> None:
    """Raise ``InvalidField`` naming the field when the constraint cannot be compiled: a
    regex that does not parse, a schema that is not JSON or uses what neither grammar engine
    supports or enforces (xgrammar, or llguidance for what xgrammar would not enforce:
    ``schema_support``), EBNF with a syntax error (no ``root`` rule included), a Lark grammar
    (``is_lark``) llguidance refuses."""
    if is_lark(spec):
        from runtime.constrained.llguidance_grammar import lark_grammar, llguidance_refusal

        refusal = llguidance_refusal(lark_grammar(spec.text))
        if refusal is not None:
            how = ", read as Lark (it has no '::=' rule)"
            if spec.text.lstrip().startswith("%llguidance"):
                how = " (with %llguidance it is Lark: rules are 'name: ...')" if "::=" in spec.text else ""
            raise InvalidField("ebnf", f"ebnf cannot be compiled{how}: {refusal}")
        return
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.text)
        except json.JSONDecodeError as err:
            raise InvalidField("json_schema", f"json_schema is not valid JSON: {err}") from err
        if not isinstance(schema, (dict, bool)):
            raise InvalidField("json_schema", f"json_schema must be a JSON object, got {type(schema).__name__}")
        error = json_schema_error(schema)
        if error is not None:
            raise InvalidField("json_schema", f"json_schema {error}")
        return
    error = _xgrammar_error(spec.kind, spec.text)
    if error is not None:
        raise InvalidField(spec.kind, f"{spec.kind} cannot be compiled: {error}")


def json_schema_error(schema: Any) -> str | None:
    """Why ``schema`` cannot be a constraint, as the end of a sentence (``is not a valid JSON
    Schema: ...``, ``cannot be compiled: ...``, ``cannot be enforced: ...``), or None. A
    schema with a part xgrammar would not enforce goes to llguidance (``auto_backend``); what
    llguidance refuses in such a schema is "cannot be enforced", unless xgrammar cannot
    compile the rest either (an invalid pattern, say): then the schema is broken in itself."""
    invalid = invalid_keyword(schema)
    if invalid is not None:
        return f"is not a valid JSON Schema: {invalid}"
    rest, problems = enforceable_part(schema)
    if problems:
        from runtime.constrained.llguidance_grammar import json_grammar, llguidance_refusal

        refusal = llguidance_refusal(json_grammar(json.dumps(schema)))
        if refusal is None:
            return None
        broken = _xgrammar_error("json_schema", json.dumps(rest))
        if broken:
            return f"cannot be compiled: {broken}"
        return f"cannot be enforced: {refusal} (the schema goes to llguidance for: {'; '.join(problems)})"
    broken = _xgrammar_error("json_schema", json.dumps(schema))
    return f"cannot be compiled: {broken}" if broken else None


def best_effort_schema(schema: Any) -> Any:
    """``schema`` for a request that did not ask for it to be kept strictly (OpenAI's
    ``strict`` false or absent: adherence is best effort): whole where some engine enforces
    it whole, else the part xgrammar enforces (``enforceable_part``), as a tool without
    ``strict`` gets. A schema that is broken in itself stays as it is (its 400 says why)."""
    reduced = _best_effort_text(json.dumps(schema, sort_keys=True))
    return schema if reduced is None else json.loads(reduced)


@lru_cache(maxsize=256)
def _best_effort_text(text: str) -> str | None:
    """``best_effort_schema`` of a schema as JSON text (compiling it takes milliseconds, and
    a client sends the same schema again and again): None where it stays whole."""
    schema = json.loads(text)
    why = json_schema_error(schema)
    if why is None or not why.startswith("cannot be enforced"):
        return None
    return json.dumps(enforceable_part(schema)[0])


def import_grammar_engine() -> None:
    """Import xgrammar (and torch with it, ~2 s) now. The HTTP server does this on a thread
    of its own while the model loads: checking a request's constraint imports it where it is
    missing, on the event loop, and every client would wait."""
    import xgrammar  # noqa: F401


def _xgrammar_error(kind: Kind, text: str) -> str | None:
    """What xgrammar says against compiling ``text`` as ``kind``, or None; also where the
    grammar has a reachable rule that can never end (``finite_output.unending_rules``)."""
    import xgrammar as xgr  # imported on first use: it takes a second or two

    build = {"regex": xgr.Grammar.from_regex, "json_schema": xgr.Grammar.from_json_schema,
             "ebnf": xgr.Grammar.from_ebnf}[kind]
    try:
        grammar = build(text)
    except Exception as err:  # the engine's parse errors are RuntimeErrors with a C++ location
        return engine_message(err)
    unending = unending_rules(str(grammar)) if kind != "regex" else []
    if unending:  # (its jump-forward string would be endless: finite_output.py)
        what = "a required property that contains itself" if kind == "json_schema" else "a rule that only recurses"
        return (f"it allows no output that ends (rules that can never end: {', '.join(unending[:5])}; "
                f"e.g. {what})")
    return None


def engine_message(err: BaseException) -> str:
    """xgrammar's message without its timestamp, source location and assertion text."""
    text = str(err).strip()
    text = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", text)
    text = re.sub(r"^Check failed: \(.*?\) is false: ", "", text)
    return text.splitlines()[0] if text else type(err).__name__
