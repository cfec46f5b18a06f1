"""OpenAI's deprecated function calling (``functions``, ``function_call``, ``function``
messages) through the official ``openai`` client: answered in its own shape
(``message.function_call``), streamed as ``function_call`` fragments, a history in that form
rendered exactly as its ``tools`` form, and what cannot be honoured a 400."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.test_server_tools import MODEL, SCHEMAS, TOOLS

pytestmark = pytest.mark.slow

FUNCTIONS = [t["function"] for t in TOOLS]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_a_named_function_call_comes_back_in_the_old_shape(client):
    kw = dict(model=MODEL, messages=ASK, functions=FUNCTIONS, function_call={"name": "get_weather"}, temperature=0,
              max_tokens=60)
    choice = client.chat.completions.create(**kw).choices[0]
    call = choice.message.function_call
    assert choice.message.tool_calls is None and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_weather"])
    assert choice.finish_reason == "stop"  # OpenAI's answer to a forced function
    name, arguments, finish = None, "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            assert c.delta.tool_calls is None
            if c.delta.function_call is not None:
                name = c.delta.function_call.name or name
                arguments += c.delta.function_call.arguments or ""
            finish = c.finish_reason or finish
    assert (name, arguments, finish) == (call.name, call.arguments, "stop")


def test_function_call_auto_answers_a_call_with_its_finish_reason(client):
    """With ``auto`` a call the model makes ends with ``"function_call"``, whole and streamed,
    for each of ``n`` samples. Four earlier turns in the old form (a call, its result, an
    answer) lead the small model to call for the fifth city at temperature 0."""
    messages = []
    for city in ("Paris", "Rome", "Madrid", "Berlin"):
        messages += [{"role": "user", "content": f"What is the weather in {city}?"},
                     {"role": "assistant", "content": None, "function_call": {
                         "name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}},
                     {"role": "function", "name": "get_weather", "content": "18 degrees"},
                     {"role": "assistant", "content": f"It is 18 degrees in {city}."}]
    messages.append({"role": "user", "content": "What is the weather in Oslo?"})
    kw = dict(model=MODEL, messages=messages, functions=FUNCTIONS, temperature=0, max_tokens=60)
    whole = client.chat.completions.create(**kw, n=2)
    for choice in whole.choices:
        assert choice.message.tool_calls is None and choice.message.function_call.name == "get_weather"
        jsonschema.validate(json.loads(choice.message.function_call.arguments), SCHEMAS["get_weather"])
        assert choice.finish_reason == "function_call"
    finishes, arguments = {}, {0: "", 1: ""}
    for chunk in client.chat.completions.create(**kw, n=2, stream=True):
        for c in chunk.choices:
            if c.delta.function_call is not None:
                arguments[c.index] += c.delta.function_call.arguments or ""
            finishes[c.index] = c.finish_reason or finishes.get(c.index)
    assert finishes == {0: "function_call", 1: "function_call"}
    assert arguments == {i: whole.choices[i].message.function_call.arguments for i in (0, 1)}


def test_function_call_none(client):
    none = client.chat.completions.create(model=MODEL, messages=ASK, functions=FUNCTIONS, function_call="none",
                                          temperature=0, max_tokens=8)
    assert none.choices[0].message.function_call is None and none.choices[0].message.content


def test_a_history_in_the_old_form_is_rendered_as_its_tools_form(server):
    call = {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}
    old = [*ASK, {"role": "assistant", "content": None, "function_call": call},
           {"role": "function", "name": "get_weather", "content": "18 degrees"}]
    new = [*ASK, {"role": "assistant", "content": None,  # 9 letters and digits, as Mistral's templates want
                  "tool_calls": [{"id": "call00001", "type": "function", "function": call}]},
           {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "18 degrees"}]

    def render(body: dict) -> dict:
        resp = httpx.post(server.url + "/v1/chat/completions/render", json={"model": MODEL, **body}, timeout=60)
        assert resp.status_code == 200, resp.text
        return resp.json()

    assert render({"messages": old, "functions": FUNCTIONS}) == render(
        {"messages": new, "tools": TOOLS, "parallel_tool_calls": False})
    assert render({"messages": old}) == render({"messages": new})  # the history alone, without functions
    mixed = [*new[:2], {"role": "function", "name": "get_weather", "content": "18 degrees"}]  # answers a tool call
    assert render({"messages": mixed}) == render({"messages": new})


@pytest.mark.parametrize("body,param,words", [
    ({"functions": FUNCTIONS, "tools": TOOLS}, "functions", "not both"),
    ({"function_call": "auto"}, "function_call", "needs 'functions'"),
    ({"functions": FUNCTIONS, "tool_choice": "auto"}, "tool_choice", "'function_call'"),
    ({"functions": FUNCTIONS, "function_call": {"nom": "x"}}, "function_call", "{\"name\": ...}"),
    ({"functions": FUNCTIONS, "function_call": {"name": "nope"}}, "function_call", "'nope', which is not among"),
    ({"functions": FUNCTIONS, "regex": "[a-z]+"}, "functions", "cannot be combined"),  # the field the client sent
    ({"messages": [*ASK, {"role": "function", "name": "get_weather", "content": "18"}]}, "messages[1]",
     "answers an assistant 'function_call'"),
])
def test_what_cannot_be_honoured_is_a_400(server, body, param, words):
    resp = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 4,
                                                                 **body}, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and words in error["message"], error
