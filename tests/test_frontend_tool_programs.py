"""DSL programs that call tools: the ReAct example gives the same conversation through
the server's OpenAI chat API (real tool calls) as through its native API, a tool
program's text is the chat template's rendering of its messages, and misplaced tool
turns are errors that name the program line."""

from __future__ import annotations

import json

import pytest

import frontend_lang as sgl
from examples.react_tool import LOOKUP, react
from tests.dsl_checks import assert_failed
from tests.tool_call_ids import same_ids

pytestmark = pytest.mark.slow


def _agent(last_turn: sgl.ir.Expr) -> sgl.SglFunction:
    """Ask, let the model call ``lookup``, answer each call, then ``last_turn`` as the
    assistant's next turn."""

    @sgl.function
    def agent(s):
        s += sgl.user("What is the capital of France?")
        s += sgl.assistant(sgl.gen("calls", max_tokens=40, tools=[LOOKUP], tool_choice="required"))
        for call in s["calls"]:
            s += sgl.tool("The capital of France is Paris.", call.id)
        s += sgl.assistant(last_turn)

    return agent


def test_react_through_openai_tool_calls_matches_the_native_api(remote, server):
    """The ReAct example as an agent framework runs it: tools and tool_choice on the chat API,
    calls back as tool_calls, results as tool messages with their tool_call_id. The native
    API, where the DSL renders the chat and holds the calls to their grammar itself, gives
    the same conversation, call for call."""
    from bench_agent.drivers.openai_chat import OpenAIChatBackend

    chat = OpenAIChatBackend(server.url)
    try:
        kwargs = {"question": "How many people live in the capital of Japan?"}
        native = react.run(**kwargs, temperature=0, backend=remote)
        api = react.run(**kwargs, temperature=0, backend=chat)
        assert same_ids(api.messages()) == same_ids(native.messages())
        assert api.ret_value == native.ret_value
    finally:
        chat.shutdown()
    calls = [c for m in api.messages() for c in m.get("tool_calls") or []]
    assert calls and all(c["function"]["name"] == "lookup" for c in calls)
    schema = LOOKUP["function"]["parameters"]
    assert all(json.loads(c["function"]["arguments"]).keys() <= schema["properties"].keys() for c in calls)
    results = [m for m in api.messages() if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in calls]


def test_a_tool_programs_text_is_the_templates_rendering_of_its_messages(local, engine):
    from runtime.server.tools.chat_prompt import render_chat

    state = _agent(sgl.gen("answer", max_tokens=12, tools=[LOOKUP], tool_choice="none")).run(temperature=0,
                                                                                             backend=local)
    assert state["calls"] and all(c.name == "lookup" and c.id.startswith("call_") for c in state["calls"])
    assert isinstance(state["answer"], str) and state["answer"] == state.get_meta_info("answer")["content"]
    messages = state.messages()[1:]  # without the default system turn the template added (a chat client sends none)
    want = render_chat(engine.tokenizer.hf, messages, [LOOKUP], add_generation_prompt=False).text
    assert state.text() == want


def test_tool_turn_errors_name_the_operation(local):
    @sgl.function
    def not_whole(s):
        s += sgl.user("Hi")
        s += sgl.assistant("Sure. " + sgl.gen("x", tools=[LOOKUP], max_tokens=8))

    assert_failed(not_whole.run(backend=local), r"gen\('x'\) at .*whole assistant turn")

    @sgl.function
    def inside(s):
        s += sgl.user("Hi" + sgl.tool("result", "call_0"))

    assert_failed(inside.run(backend=local), r"tool\('call_0'\) at .*between turns")


def test_gen_n_after_tool_turns_is_a_clear_error(local):
    assert_failed(_agent(sgl.gen("answer", max_tokens=4, n=2)).run(temperature=0, backend=local),
                  "more than one sample")
