"""LangChain's OpenAI chat model (``langchain-openai``, in the test extra), unchanged, against
``forkserve serve``, on chat completions and on the Responses API (``use_responses_api``): a
plain call, a streamed one, and a tool loop through ``bind_tools`` whose calls name the
declared tool with arguments its schema accepts."""

from __future__ import annotations

import json

import jsonschema
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module", params=[False, True], ids=["chat_completions", "responses"])
def chat(server, request):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key="unused", temperature=0, max_tokens=40,
                      max_retries=0, use_responses_api=request.param)


def test_invoke_and_stream(chat):
    reply = chat.invoke("Name a planet.")
    assert reply.text
    meta = reply.response_metadata
    assert meta.get("finish_reason", meta.get("status")) in ("stop", "length", "completed", "incomplete")
    streamed = "".join(chunk.text for chunk in chat.stream("Name a planet."))
    assert streamed == reply.text  # greedy: the same text either way


def test_a_tool_loop_through_bind_tools(chat):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"{city}: 18 degrees, sunny"

    schema = get_weather.tool_call_schema.model_json_schema()
    messages = [HumanMessage("What is the weather in Paris?")]
    ai = chat.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False).invoke(messages)
    assert [c["name"] for c in ai.tool_calls] == ["get_weather"]
    for call in ai.tool_calls:
        jsonschema.validate(call["args"], schema)
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    answer = chat.bind_tools([get_weather]).invoke(messages)  # the history carries the call and its result
    assert answer.content or answer.tool_calls
    assert json.dumps(answer.tool_calls)  # whatever it chose, it came back as LangChain objects
