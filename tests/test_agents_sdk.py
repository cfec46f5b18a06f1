"""A real agent framework from PyPI, the OpenAI Agents SDK, runs an agent with a function
tool to completion against ``forkserve serve``, through its chat-completions model class and
through its default one, on the Responses API (``/v1/responses``), streamed, with
``truncation="auto"`` as agents that run long set it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

import pytest
from pydantic import Field, HttpUrl  # the tool's annotations below are resolved in this module

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


def _weather_agent(model, cities: list[str], **settings):
    from agents import Agent, ModelSettings, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would upload traces to OpenAI

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        cities.append(city)
        return f"{city}: 18 degrees, sunny"

    return Agent(name="weather", instructions="Answer weather questions with the get_weather tool.",
                 tools=[get_weather], model=model,
                 model_settings=ModelSettings(temperature=0, tool_choice="required", **settings))


def test_an_agents_sdk_agent_runs_to_completion(server):
    from agents import OpenAIChatCompletionsModel, Runner
    from openai import AsyncOpenAI

    cities: list[str] = []
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=AsyncOpenAI(base_url=server.url + "/v1", api_key="x"))
    result = Runner.run_sync(_weather_agent(model, cities, max_tokens=60), "What is the weather in Paris?", max_turns=4)
    assert cities and all(isinstance(c, str) and c for c in cities)  # the tool ran with valid arguments
    assert isinstance(result.final_output, str) and result.final_output  # then the model answered in text


def test_an_agents_sdk_agent_runs_on_the_responses_api_streamed(server):
    from agents import OpenAIResponsesModel, Runner
    from openai import AsyncOpenAI

    async def run() -> tuple[object, set[str]]:
        model = OpenAIResponsesModel(model=MODEL, openai_client=AsyncOpenAI(base_url=server.url + "/v1", api_key="x"))
        agent = _weather_agent(model, cities, max_tokens=100, parallel_tool_calls=False, truncation="auto")
        result = Runner.run_streamed(agent, "What is the weather in Rome?", max_turns=4)
        kinds = {event.type async for event in result.stream_events()}
        return result.final_output, kinds

    cities: list[str] = []
    final_output, kinds = asyncio.run(run())
    assert cities and all(isinstance(c, str) and c for c in cities)  # the tool ran with valid arguments
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert isinstance(final_output, str) and final_output


def test_a_strict_tool_with_a_url_and_a_bounded_pattern_runs(server):
    """The SDK marks every function tool ``strict``. A pydantic ``HttpUrl`` (``format: uri`` with
    a ``maxLength``) and a length-bounded pattern are schema parts xgrammar would not keep whole;
    the call grammar is llguidance's, and the SDK's own pydantic check of the arguments passes."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.exceptions import MaxTurnsExceeded
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    fetched: list[tuple[str, str]] = []

    @function_tool
    def fetch_page(url: HttpUrl, lang: Annotated[str, Field(pattern="^[a-z]+$", max_length=2)]) -> str:
        """Fetch a web page in a language (a two-letter code)."""
        fetched.append((str(url), lang))
        return "Example Domain. This domain is for use in examples."

    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=AsyncOpenAI(base_url=server.url + "/v1", api_key="x"))
    agent = Agent(name="reader", instructions="Use fetch_page to read pages.", tools=[fetch_page], model=model,
                  model_settings=ModelSettings(temperature=0, tool_choice="required", max_tokens=80))
    with contextlib.suppress(MaxTurnsExceeded):  # the small model may keep calling: its calls are what is checked
        Runner.run_sync(agent, "Read https://example.com in English.", max_turns=3)
    assert fetched  # the SDK validated the arguments with pydantic before it ran the tool
    assert all(len(lang) <= 2 and lang.isalpha() for _, lang in fetched)
