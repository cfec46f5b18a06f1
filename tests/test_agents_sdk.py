"""A real agent framework from PyPI, the OpenAI Agents SDK, runs an agent with a function
tool to completion against ``forkserve serve`` through its chat-completions model class."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


def test_an_agents_sdk_agent_runs_to_completion(server):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK would upload traces to OpenAI
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        cities.append(city)
        return f"{city}: 18 degrees, sunny"

    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=AsyncOpenAI(base_url=server.url + "/v1", api_key="x"))
    agent = Agent(name="weather", instructions="Answer weather questions with the get_weather tool.",
                  tools=[get_weather], model=model,
                  model_settings=ModelSettings(temperature=0, max_tokens=60, tool_choice="required"))
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert cities and all(isinstance(c, str) and c for c in cities)  # the tool ran with valid arguments
    assert isinstance(result.final_output, str) and result.final_output  # then the model answered in text
