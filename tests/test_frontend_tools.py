"""The DSL's tool-call pieces without a model: gen's tool arguments are checked, calls keep
the model's arguments text and decode it, and the ids a native backend gives calls are
unique in the conversation and the same on every run."""

from __future__ import annotations

import pytest

import frontend_lang as sgl
from frontend_lang.tools import ToolCall, count_calls, split_calls

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]}}}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tools": []}, "non-empty list"),
        ({"tools": [{"name": "lookup"}]}, 'each tool must be {"type": "function"'),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice must be one of"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "names 'other', which is not one of the given tools"),
        ({"tool_choice": "required"}, "need tools"),
        ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {
            "mode": "auto", "tools": [{"type": "function", "function": {"name": "other"}}]}}}, "not one of the given"),
        ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls must be"),
        ({"tools": [TOOL], "regex": "[a-z]+"}, "cannot be combined"),
    ],
)
def test_gen_checks_its_tool_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sgl.gen("x", **kwargs)


def test_a_gen_with_tools_carries_them():
    gen = sgl.gen("x", tools=[TOOL], tool_choice="required", parallel_tool_calls=False)
    assert gen.tools.request_fields() == {"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False}
    assert sgl.gen("y").tools is None
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "lookup"}}]}}
    assert sgl.gen("z", tools=[TOOL], tool_choice=allowed).tools.request_fields()["tool_choice"] == allowed


def test_calls_are_read_with_the_format_and_numbered_after_the_history():
    text = ('<tool_call>\n{"name": "lookup", "arguments": {"topic":"Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "lookup", "arguments": {"topic": "Rome"}}\n</tool_call>')
    history = [{"role": "assistant", "content": "", "tool_calls": [ToolCall("call_0", "lookup", "{}").as_openai()]}]
    content, calls = split_calls("hermes", text, count_calls(history))
    assert content == "" and [c.id for c in calls] == ["call_1", "call_2"]
    assert calls[0].arguments == '{"topic":"Paris"}' and calls[0].args == {"topic": "Paris"}
    assert split_calls(None, text, 0) == (text, [])  # tool_choice none: the text is the answer


def test_tool_results_need_an_id():
    with pytest.raises(ValueError, match="tool_call_id"):
        sgl.tool("result", "")
