"""What a request says of reasoning reaches the chat template: an assistant turn's reasoning
sent back (``reasoning_content`` on a chat message; a Responses ``reasoning`` item's
``reasoning_text`` as the ``reasoning_content`` of the assistant message after it), shown or
not as the template decides (here as reasoning models' templates do: the turn in progress
only); and ``reasoning_effort``, given to a template that reads it, moot for a model that
does not reason, refused (naming the field) for a reasoning model whose template has none."""

from __future__ import annotations

import pytest

from runtime.sampling.params import InvalidField
from runtime.server.protocol_openai import ChatMessage
from runtime.server.responses_input import input_messages
from runtime.server.tools.chat_prompt import render_chat

# A reasoning model's way (Qwen3's rule, written here): reasoning shown only for the assistant
# messages after the last user message, i.e. between the tool calls of the turn in progress.
THINKING_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor -%}"
    "{%- for m in messages -%}"
    "<|{{ m.role }}|>"
    "{%- if m.role == 'assistant' and m.reasoning_content and loop.index0 > ns.last_user -%}"
    "<think>{{ m.reasoning_content }}</think>"
    "{%- endif -%}"
    "{{ m.content }}{% for c in m.tool_calls or [] %}[call {{ c.function.name }}]{% endfor %}|"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)


def reasoning(text: str) -> dict:
    return {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


CALL = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q": "Oslo"}'}
CHAT_CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "Oslo"}'}}


def test_reasoning_items_become_the_next_assistant_messages_reasoning():
    items = [
        {"role": "user", "content": "Weather in Oslo?"},
        reasoning("I should look it up."), CALL,
        {"type": "function_call_output", "call_id": "call_1", "output": "3 degrees"},
        reasoning("Now I can answer."),
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 3 degrees."}]},
        reasoning("left before a user message: dropped"),
        {"role": "user", "content": "Thanks"},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "a summary"}]},
        {"type": "message", "role": "assistant", "content": "You are welcome."},
    ]
    assert input_messages(items) == [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [CHAT_CALL], "reasoning_content": "I should look it up."},
        {"role": "tool", "tool_call_id": "call_1", "content": "3 degrees"},
        {"role": "assistant", "content": "It is 3 degrees.", "reasoning_content": "Now I can answer."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "You are welcome."},  # a summary is not the reasoning
    ]


def test_a_message_and_its_calls_are_one_turn_with_the_reasoning_before_them():
    items = [{"role": "user", "content": "Hi"}, reasoning("Greet, then look up."),
             {"type": "message", "role": "assistant", "content": "Hello."}, CALL]
    assert input_messages(items)[1] == {"role": "assistant", "content": "Hello.", "tool_calls": [CHAT_CALL],
                                        "reasoning_content": "Greet, then look up."}


def test_the_chat_message_passes_an_assistants_reasoning_to_the_template():
    said = ChatMessage.model_validate({"role": "assistant", "content": "Hi.", "reasoning_content": "Be brief."})
    assert said.as_template_dict() == {"role": "assistant", "content": "Hi.", "reasoning_content": "Be brief."}
    user = ChatMessage.model_validate({"role": "user", "content": "Hi", "reasoning_content": "not a user's"})
    assert "reasoning_content" not in user.as_template_dict()


@pytest.fixture(scope="module")
def hf(model_dir):
    from runtime.tokenizer import Tokenizer

    return Tokenizer(model_dir).hf


def test_a_thinking_template_shows_the_reasoning_of_the_turn_in_progress(hf):
    items = [{"role": "user", "content": "Weather in Oslo?"}, reasoning("I should look it up."), CALL,
             {"type": "function_call_output", "call_id": "call_1", "output": "3 degrees"}]
    messages = [ChatMessage.model_validate(m).as_template_dict() for m in input_messages(items)]
    text = render_chat(hf, messages, chat_template=THINKING_TEMPLATE).text
    assert text == ("<|user|>Weather in Oslo?|<|assistant|><think>I should look it up.</think>[call lookup]|"
                    "<|tool|>3 degrees|<|assistant|>")


def test_reasoning_effort_goes_to_a_template_that_reads_it(hf):
    """A template that reads the effort gets it; a model that does not reason (no reasoning
    parser) answers with no reasoning whatever the effort, as asked; a reasoning model whose
    template has no effort is refused, naming the field."""
    reads = "{% if reasoning_effort %}Reasoning: {{ reasoning_effort }}|{% endif %}" + THINKING_TEMPLATE
    hi = [{"role": "user", "content": "Hi"}]
    for reasoning_model in (False, True):
        assert render_chat(hf, hi, chat_template=reads, reasoning_effort="low",
                           reasoning_model=reasoning_model).text == "Reasoning: low|<|user|>Hi|<|assistant|>"
    assert render_chat(hf, hi, chat_template=reads).text == "<|user|>Hi|<|assistant|>"
    plain = render_chat(hf, hi, chat_template=THINKING_TEMPLATE).text
    assert render_chat(hf, hi, chat_template=THINKING_TEMPLATE, reasoning_effort="high").text == plain
    with pytest.raises(InvalidField, match="does not read it") as err:
        render_chat(hf, hi, chat_template=THINKING_TEMPLATE, reasoning_effort="low", reasoning_model=True)
    assert err.value.field == "reasoning_effort"


@pytest.mark.parametrize("switch", ["enable_thinking", "thinking"])
def test_effort_none_turns_a_templates_thinking_switch_off(hf, switch):
    """SGLang's reading of ``reasoning_effort: "none"`` for templates with a switch and no
    effort (Qwen3's ``enable_thinking``, DeepSeek's ``thinking``); other efforts stay refused."""
    template = ("{% if " + switch + " is defined and not " + switch + " %}<no-think>{% endif %}" + THINKING_TEMPLATE)
    hi = [{"role": "user", "content": "Hi"}]
    off = render_chat(hf, hi, chat_template=template, reasoning_effort="none", reasoning_model=True)
    assert off.text == "<no-think><|user|>Hi|<|assistant|>"
    assert off.thinking is False  # the answer then has no reasoning for the parser to split off
    assert render_chat(hf, hi, chat_template=template, template_kwargs={switch: False}).thinking is False
    kept = render_chat(hf, hi, chat_template=template, reasoning_effort="none", reasoning_model=True,
                       template_kwargs={switch: True})  # the client's own switch wins
    assert kept.text == "<|user|>Hi|<|assistant|>" and kept.thinking is True
    # a word in the template's text, or a longer name, is no switch: "none" is refused there
    with pytest.raises(InvalidField, match="does not read it"):
        render_chat(hf, hi, chat_template="Be thinking. {{ is_" + switch + " }}" + THINKING_TEMPLATE,
                    reasoning_effort="none", reasoning_model=True)
    with pytest.raises(InvalidField, match="does not read it"):
        render_chat(hf, hi, chat_template=template, reasoning_effort="low", reasoning_model=True)


def test_an_assistant_refusal_in_the_history_is_what_it_said():
    """OpenAI's answer that refused comes back as a ``refusal`` part or field: the template
    gets its text; a non-text part of any other kind is a 400."""
    from runtime.server.protocol import ApiError
    from runtime.server.protocol_openai import ChatMessage

    part = ChatMessage.model_validate({"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]})
    assert part.as_template_dict()["content"] == "I can't."
    field = ChatMessage.model_validate({"role": "assistant", "refusal": "No."})
    assert field.as_template_dict()["content"] == "No."
    image = ChatMessage.model_validate({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})
    with pytest.raises(ApiError, match="'image_url' is not supported"):
        image.as_template_dict()
