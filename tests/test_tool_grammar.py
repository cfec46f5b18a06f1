"""The grammars that enforce tool calls (``runtime/server/tools/constraint.py``), checked
against hand-written outputs for every format: which texts each ``tool_choice`` and
``parallel_tool_calls`` setting lets the model write, and which it does not. Each accepted
text also parses back into the same calls with the format's parser."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

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


@pytest.mark.parametrize("parallel", [True, False])
def test_a_named_function_allows_only_that_one(parallel):
    grammar = tool_grammar(TOOLS, {"type": "function", "function": {"name": "add"}}, "hermes", parallel)
    assert accepts(grammar, block("hermes", [ADD]))
    assert not accepts(grammar, block("hermes", [WEATHER]))
    assert accepts(grammar, block("hermes", [ADD, ADD])) == parallel


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
