"""Which JSON schemas are refused as not enforceable, checked against the grammar engine both
ways: every refused part is one xgrammar compiles and then lets a violating instance through
(so refusing it is needed), every accepted one it enforces (so refusing it would be wrong).
No model: instances are matched against the compiled grammar as text."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.constrained.schema_support import enforceable_part, pattern_problem, unhonoured_feature
from runtime.constrained.spec import GrammarSpec, check_spec
from runtime.sampling.params import InvalidField


@pytest.fixture(scope="module")
def llguidance_backend(model_dir):
    from runtime.constrained.llguidance_backend import LLGuidanceBackend
    from runtime.tokenizer import load_hf_tokenizer

    tokenizer = load_hf_tokenizer(model_dir)
    return LLGuidanceBackend(tokenizer, 49152, (tokenizer.eos_token_id,)), tokenizer


def _engine_accepts(schema: dict, instance_text: str) -> bool:
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)  # as the server compiles
    return _is_grammar_accept_string(grammar, instance_text)


def _string(**keywords) -> dict:
    return {"type": "object", "properties": {"s": {"type": "string", **keywords}}, "required": ["s"]}


# (schema, a text that breaks it, words of the refusal)
REFUSED = [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]", ["uniqueItems", "top level"]),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[]", ["contains"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependentRequired": {"a": ["b"]}}, '{"a": 1}', ["dependentRequired"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependentSchemas": {"a": {"required": ["b"]}}}, '{"a": 1}', ["dependentSchemas"]),
    ({"type": "integer", "not": {"const": 1}}, "1", ["'not'"]),
    ({"type": "integer", "if": {"minimum": 0}, "then": {"minimum": 5}}, "1", ["'if'"]),
    ({"allOf": [{"type": "integer"}, {"minimum": 5}]}, "1", ["allOf"]),
    ({"type": "number", "multipleOf": 0.5}, "0.3", ["multipleOf"]),
    (_string(pattern="^a+$", maxLength=2), '{"s": "aaa"}', ["pattern", "maxLength", "properties.s"]),
    (_string(pattern="^a+$", minLength=3), '{"s": "a"}', ["minLength"]),
    (_string(format="date", pattern="^2024-"), '{"s": "2018-01-01"}', ["format", "pattern"]),
    (_string(format="email", maxLength=5), '{"s": "abc@def.com"}', ["format", "maxLength"]),
    (_string(pattern="^(?!b)[a-z]+$"), '{"s": "ba"}', ["look-around"]),
    (_string(pattern='^a"b$'), '{"s": "a"b"}', ["quote, backslash or control"]),
    (_string(pattern="^[\\t]{2}$"), '{"s": "\t\t"}', ["quote, backslash or control"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["zz"]}, '{"a": 1}', ["'zz'"]),
    ({"$ref": "http://example.com/schema.json"}, '"anything"', ["$ref", "another document"]),
    ({"minimum": 5}, "1", ["'minimum' without a 'type'"]),
    ({"anyOf": [{"type": "string"}], "minLength": 3}, '"ab"', ["minLength"]),
    ({"type": "string", "format": "uri-reference", "minLength": 1}, '""', ["format", "minLength"]),
    ({"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
      "required": ["xs"]}, '{"xs": [2, 2]}', ["uniqueItems", "properties.xs"]),
    # beside a combinator or a reference, xgrammar keeps only that: "b" is not required
    ({"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"],
      "allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}]}, '{"a": 1}', ["beside 'allOf'", "required"]),
    ({"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"],
      "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}]}, '{"a": 1}', ["beside 'anyOf'"]),
    ({"$defs": {"p": {"type": "object", "properties": {"a": {"type": "integer"}}}}, "$ref": "#/$defs/p",
      "properties": {"b": {"type": "boolean"}}, "required": ["b"]}, '{"a": 1}', ["beside '$ref'", "required"]),
]

# (schema, a text that breaks it): the engine refuses the text
ENFORCED = [
    ({"type": "integer", "multipleOf": 3}, "4"),
    ({"type": "integer", "minimum": 3}, "2"),
    (_string(minLength=2, maxLength=3), '{"s": "aaaa"}'),
    (_string(pattern="^[a-z]+$"), '{"s": "a1"}'),
    (_string(pattern="^[ -~]+$"), '{"s": "a"b"}'),  # a class with a quote: only plain characters come out
    (_string(pattern="^(\\t|a)$"), '{"s": "\t"}'),
    (_string(format="date"), '{"s": "hello"}'),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 1}, "[1, 2]"),
    ({"type": "object", "additionalProperties": True, "maxProperties": 1}, '{"a": 1, "b": 2}'),
    ({"type": "object", "propertyNames": {"pattern": "^a$"}}, '{"b": 1}'),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, '{"x": "s"}'),
    ({"allOf": [{"type": "integer", "minimum": 5}]}, "1"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False}, '{"a": 1, "b": 2}'),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}, '"x"'),
    ({"type": "string", "format": "uri", "minLength": 1}, '""'),  # pydantic's AnyUrl: the format implies it
    ({"type": "string", "format": "password", "minLength": 8}, '"ab"'),  # a format xgrammar ignores
    ({"type": ["integer", "null"], "multipleOf": 2}, "3"),
    ({"properties": {"a": {"type": "integer"}}, "required": ["a"]}, "{}"),  # an object without "type"
]


@pytest.mark.parametrize(("schema", "violation", "words"), REFUSED)
def test_a_part_xgrammar_would_let_through_is_found(schema, violation, words):
    assert _engine_accepts(schema, violation)  # leaving it to xgrammar would break the schema
    problem = unhonoured_feature(schema)
    assert problem is not None and all(w in problem for w in words), problem


# What llguidance, the engine such schemas go to, refuses in turn: these are 400s.
LLGUIDANCE_REFUSES = ("uniqueItems", "contains", "dependentRequired", "dependentSchemas", "'not'", "'if'",
                      "look-around", "another document", "is not in 'properties'", "'uri-reference'",
                      "beside 'anyOf'", "beside '$ref'")


@pytest.mark.parametrize(("schema", "violation", "words"), REFUSED)
def test_such_a_schema_goes_to_llguidance_which_enforces_it_or_it_is_refused(schema, violation, words, llguidance_backend):
    spec = GrammarSpec("json_schema", json.dumps(schema))
    if any(w in unhonoured_feature(schema) for w in LLGUIDANCE_REFUSES):
        with pytest.raises(InvalidField) as err:
            check_spec(spec)
        assert err.value.field == "json_schema" and "cannot be enforced" in str(err.value)
        return
    check_spec(spec)  # taken
    backend, tokenizer = llguidance_backend
    matcher = backend.compile(spec).matcher()
    ids = tokenizer.encode(violation, add_special_tokens=False)
    assert not all(matcher.accept_token(t) for t in ids) or not matcher.accept_token(tokenizer.eos_token_id)


@pytest.mark.parametrize(("schema", "violation"), ENFORCED)
def test_an_accepted_part_is_enforced(schema, violation):
    assert unhonoured_feature(schema) is None
    assert not _engine_accepts(schema, violation)


@pytest.mark.parametrize(("schema", "violation", "words"), REFUSED)
def test_the_enforceable_part_is_looser_and_fully_enforced(schema, violation, words):
    looser, problems = enforceable_part(schema)
    assert problems and unhonoured_feature(looser) is None
    check_spec(GrammarSpec("json_schema", json.dumps(looser)))  # compiles


def test_a_schema_the_engine_honours_is_left_as_it_is():
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
              "required": ["name"], "additionalProperties": False}
    assert enforceable_part(schema) == (schema, [])


# Patterns over a quote, a backslash, a tab and "a": whether some string of only "a"s (the
# escape-free strings such a pattern can match) matches, by brute force, against the check.
_ATOMS = ["a", '"', "\\\\", "\\t", "[a\\t]", '["\\\\]', "[\\x00-\\x1f]", "[ -\\x21]"]


@st.composite
def _patterns(draw, depth: int = 0) -> str:
    if depth >= 2 or draw(st.booleans()):
        return draw(st.sampled_from(_ATOMS))
    parts = draw(st.lists(_patterns(depth + 1), min_size=1, max_size=2))
    form = draw(st.sampled_from(["cat", "alt", "opt", "star", "two"] if depth == 0 else ["cat", "alt", "opt", "star"]))
    if form == "cat":
        return "".join(parts)
    if form == "alt":
        return "(" + "|".join(parts) + ")"
    return "(" + "".join(parts) + ")" + {"opt": "?", "star": "*", "two": "{2}"}[form]


@settings(max_examples=300, deadline=None)
@given(_patterns())
def test_escape_free_check_agrees_with_brute_force(pattern):
    compiled = re.compile(pattern)
    # "[ -\x21]" holds "!", a plain character beside "a"; no shortest match is over 8 long
    brute = any(compiled.fullmatch("".join(s)) for n in range(9) for s in itertools.product("a!", repeat=n))
    assert (pattern_problem(pattern) is None) == brute


@pytest.mark.parametrize("schema", [
    _string(pattern="^[a-z]+$", maxLength=3),
    _string(pattern='^a"b\\\\c$'),  # a quote and a backslash: escaped in the JSON
    _string(format="date", pattern="^2024-"),
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"],
     "allOf": [{"required": ["n"]}, {"properties": {"n": {"multipleOf": 3}}}]},
])
def test_llguidance_output_follows_the_schema_on_random_walks(schema, llguidance_backend):
    _random_walks(schema, llguidance_backend)


def test_an_object_made_of_all_of_parts_is_closed_to_their_properties(llguidance_backend):
    """Properties beside an allOf and in its parts are all allowed (closing the object to its
    own alone made the schema unsatisfiable), and no others, as on xgrammar's path."""
    schema = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["id"],
              "allOf": [{"properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]},
                        {"properties": {"b": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"}},
                         "required": ["b"]}]}
    check_spec(GrammarSpec("json_schema", json.dumps(schema)))
    for out in _random_walks(schema, llguidance_backend):
        assert set(out) == {"id", "a", "b"}, out


def _random_walks(schema: dict, llguidance_backend) -> list:
    """Random allowed tokens (the end whenever it is allowed) make valid JSON of the schema."""
    import random

    import jsonschema

    from runtime.constrained.bitmask import allocate_bitmask, allowed_tokens

    backend, tokenizer = llguidance_backend
    grammar = backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
    eos, outs = tokenizer.eos_token_id, []
    for seed in range(4):
        rng, matcher, ids = random.Random(seed), grammar.matcher(), []
        while not matcher.is_terminated():
            mask = allocate_bitmask(1, backend.vocab_size)
            matcher.fill_bitmask(mask, 0)
            allowed = allowed_tokens(mask[0], backend.vocab_size).nonzero().flatten().tolist()
            token = eos if eos in allowed else rng.choice(allowed)
            assert matcher.accept_token(token) and len(ids) < 200
            ids += [] if token == eos else [token]
        out = json.loads(tokenizer.decode(ids))
        jsonschema.validate(out, schema, format_checker=jsonschema.FormatChecker())
        outs.append(out)
    return outs


def test_a_malformed_required_list_is_the_schemas_error_not_a_crash():
    """A ``required`` entry that is not a name used to raise TypeError (a 400 naming
    ``prompt``); it is the engine's to judge, as a json_schema error."""
    schema = {"type": "object", "properties": {}, "required": [{"x": 1}]}
    assert enforceable_part(schema)[0]["required"] == []
    with pytest.raises(InvalidField) as err:
        check_spec(GrammarSpec("json_schema", json.dumps(schema)))
    assert err.value.field == "json_schema"


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "number", "multipleOf": -0.5}, "'multipleOf' must be a number greater than 0, got -0.5 (at the top level)"),
    ({"type": "integer", "multipleOf": 0}, "'multipleOf' must be a number greater than 0"),
    (_string(minLength=-1), "'minLength' must be a non-negative integer, got -1 (at properties.s)"),
    (_string(maxLength=2.5, pattern="^a+$"), "'maxLength' must be a non-negative integer, got 2.5"),
    ({"type": "object", "properties": {"xs": {"type": "array", "anyOf": [{"minItems": -2}]}}},
     "'minItems' must be a non-negative integer, got -2 (at properties.xs.anyOf[0])"),
])
def test_keyword_values_json_schema_forbids_are_refused_where_the_engines_would_take_them(schema, words):
    """Values JSON Schema does not allow, which an engine reads as no bound (xgrammar takes
    minLength -1; llguidance multipleOf -0.5), are a 400 naming the keyword and its place."""
    with pytest.raises(InvalidField, match=re.escape(words)) as err:
        check_spec(GrammarSpec("json_schema", json.dumps(schema)))
    assert err.value.field == "json_schema" and "not a valid JSON Schema" in str(err.value)


def test_a_tool_with_such_a_value_is_refused_naming_the_tool():
    from runtime.server.tools.constraint import tool_grammar

    tool = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"k": {"type": "integer", "multipleOf": -3}}}}}
    with pytest.raises(InvalidField, match="parameters of tool 'pick' are not a valid JSON Schema: 'multipleOf'") as err:
        tool_grammar([tool], "auto", "hermes")
    assert err.value.field == "tools"


@pytest.mark.parametrize("kind", ["array", "string", ["integer", "null"]])
def test_a_tool_whose_arguments_would_not_be_an_object_is_refused(kind):
    """Its call markup came back as the answer's text, even with tool_choice required."""
    from runtime.server.tools.constraint import tool_grammar

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": kind}}}
    with pytest.raises(InvalidField, match="parameters of tool 'f' must be a JSON Schema of type 'object'") as err:
        tool_grammar([tool], "required", "hermes")
    assert err.value.field == "tools"

