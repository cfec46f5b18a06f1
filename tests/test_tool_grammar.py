"""The grammars that enforce tool calls (``runtime/server/tools/constraint.py``), checked
against hand-written outputs for every format: which texts each ``tool_choice`` and
``parallel_tool_calls`` setting (``allowed_tools`` included) lets the model write, and which
it does not; and how each ``tool_choice`` form is read. Each accepted
text also parses back into the same calls with the format's parser."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from runtime.sampling.params import InvalidField
from runtime.server.tools.choice import CallRule, call_rule
from runtime.server.tools.constraint import tool_grammar
from runtime.server.tools.parsers import get_parser

accepts = xgr.testing._is_grammar_accept_string

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
WEATHER, ADD = ("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})


def block(fmt: str, calls: list[tuple[str, dict]]) -> str:
    """A format's way of writing ``calls`` together, as its models write them."""
    if fmt in ("hermes", "qwen25"):
        return "\n".join(f'<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a)}}}\n</tool_call>' for n, a in calls)
    if fmt == "llama3_json":
        return "; ".join(f'{{"name": "{n}", "parameters": {json.dumps(a)}}}' for n, a in calls)
    return "[TOOL_CALLS] [" + ", ".join(f'{{"name": "{n}", "arguments": {json.dumps(a)}}}' for n, a in calls) + "]"


@pytest.mark.parametrize("fmt", ["hermes", "qwen25", "llama3_json", "mistral"])
@pytest.mark.parametrize("parallel", [True, False])
def test_required_allows_only_calls_and_parallel_allows_several(fmt, parallel):
    grammar = tool_grammar(TOOLS, "required", fmt, parallel)
    one, two = block(fmt, [WEATHER]), block(fmt, [WEATHER, ADD])
    assert accepts(grammar, one)
    assert accepts(grammar, two) == parallel
    assert not accepts(grammar, "The weather is nice.")
    assert not accepts(grammar, "Sure. " + one)
    assert not accepts(grammar, block(fmt, [("get_weather", {"town": "Paris"})]))  # not the tool's schema
    assert not accepts(grammar, block(fmt, [("get_time", {})]))  # not a declared tool
    for text, calls in ((one, [WEATHER]), (two, [WEATHER, ADD])):
        if accepts(grammar, text):
            _, parsed = get_parser(fmt).parse(text)
            assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
@pytest.mark.parametrize("parallel", [True, False])
def test_a_named_function_allows_exactly_one_call_of_it(fmt, parallel):
    # OpenAI's forced function: "call exactly one specific function", parallel or not.
    grammar = tool_grammar(TOOLS, {"type": "function", "function": {"name": "add"}}, fmt, parallel)
    assert accepts(grammar, block(fmt, [ADD]))
    assert not accepts(grammar, block(fmt, [WEATHER]))
    assert not accepts(grammar, block(fmt, [ADD, ADD]))


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_allows_text_and_valid_calls_and_stops_after_one_unless_parallel(parallel):
    grammar = tool_grammar(TOOLS, "auto", "hermes", parallel)
    call, other = block("hermes", [WEATHER]), block("hermes", [ADD])
    assert accepts(grammar, "It is sunny in Paris today.")
    assert accepts(grammar, "Let me check. " + call)
    assert accepts(grammar, call + "\n" + other) == parallel
    assert not accepts(grammar, '<tool_call>\n{"name": "get_weather", "arguments": {"town": "x"}}\n</tool_call>')


def test_none_enforces_nothing():
    assert tool_grammar(TOOLS, "none", "hermes") is None


@pytest.mark.parametrize("fmt", ["hermes", "qwen25", "llama3_json", "mistral"])
def test_auto_with_an_answer_schema_allows_calls_or_that_json_only(fmt):
    """tools + a JSON response_format (the Agents SDK's structured output beside tools): the
    answer either calls tools or is one value of the schema, never free text."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}
    grammar = tool_grammar(TOOLS, "auto", fmt, answer_schema=schema)
    assert accepts(grammar, block(fmt, [WEATHER]))
    assert accepts(grammar, block(fmt, [WEATHER, ADD]))
    assert accepts(grammar, '{"answer": "sunny"}')
    assert not accepts(grammar, '{"answer": 3}')
    assert not accepts(grammar, "It is sunny.")
    # a forced call stays a call: the schema is for the answer that follows the tools' results
    assert not accepts(tool_grammar(TOOLS, "required", fmt, answer_schema=schema), '{"answer": "sunny"}')


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
def test_allowed_tools_limits_the_calls_to_those_tools(fmt):
    """allowed_tools: every tool stays in the prompt, only the listed ones may be called;
    mode ``required`` is calls only, ``auto`` also free text."""
    only_add = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "add"}}]}}
    required = tool_grammar(TOOLS, only_add, fmt)
    assert accepts(required, block(fmt, [ADD]))
    assert accepts(required, block(fmt, [ADD, ADD]))
    assert not accepts(required, block(fmt, [WEATHER]))
    assert not accepts(required, block(fmt, [ADD, WEATHER]))
    assert not accepts(required, "I will not call anything.")
    auto = tool_grammar(TOOLS, {**only_add, "allowed_tools": {**only_add["allowed_tools"], "mode": "auto"}}, fmt)
    assert accepts(auto, "I will not call anything.")
    if fmt == "hermes":  # a call inside free text opens at the format's trigger
        assert accepts(auto, "Adding. " + block(fmt, [ADD]))
        assert not accepts(auto, "Checking. " + block(fmt, [WEATHER]))


@pytest.mark.parametrize(
    ("tools", "choice", "words"),
    [
        (None, "required", "needs 'tools'"),
        (TOOLS, "sometimes", "must be one of"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "must name one of the given tools"),
        (TOOLS, {"type": "allowed_tools", "allowed_tools": {"mode": "sometimes", "tools": [
            {"type": "function", "function": {"name": "add"}}]}}, 'needs "mode"'),
        (TOOLS, {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, "non-empty"),
        (TOOLS, {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
            {"type": "function", "function": {"name": "nope"}}]}}, "'nope', which is not one of the given"),
        (TOOLS, {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
            {"type": "function", "name": "add"}]}}, "each of allowed_tools.tools must be"),
        (TOOLS, {"type": "custom", "custom": {"name": "add"}}, "must be one of"),
    ],
)
def test_a_tool_choice_the_request_cannot_honour_names_the_field(tools, choice, words):
    with pytest.raises(InvalidField, match=words) as err:
        call_rule(tools, choice)
    assert err.value.field == "tool_choice"


def test_the_call_rule_of_each_form():
    names = ("get_weather", "add")
    assert call_rule(TOOLS, None) == CallRule("auto", names)
    assert call_rule(None, None) == CallRule("none", ())
    assert call_rule(None, "auto") == call_rule([], "auto") == CallRule("none", ())  # nothing to call
    assert call_rule(TOOLS, "none") == CallRule("none", names)
    assert call_rule(TOOLS, {"type": "function", "function": {"name": "add"}}) == CallRule("required", ("add",), single=True)
    both = [{"type": "function", "function": {"name": n}} for n in ("add", "get_weather")]
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": both}}
    assert call_rule(TOOLS, allowed) == CallRule("auto", names)  # in the request's order
