"""The shipped tool templates (``runtime/server/tools/*_tools.jinja``): each renders a tool
conversation so that the calls in its assistant turn are exactly what its format's grammar
lets a model write and what its parser reads back; ``--tool-call-parser auto`` reads each
one's format; a model whose own template cannot show tools gets the shipped template of its
chat format. And ``--chat-template FILE`` on a real server: it replaces the model's template
for chats with and without tools, the DSL's role markers and the call format follow it."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import xgrammar as xgr

from runtime.server.tools.chat_prompt import render_chat
from runtime.server.tools.constraint import tool_grammar
from runtime.server.tools.parsers import parser_for_template
from runtime.server.tools.template import SHIPPED, load_chat_template, tool_template

FORMATS = {"chatml_hermes_tools": "hermes", "llama3_json_tools": "llama3_json", "mistral_tools": "mistral"}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
        "additionalProperties": False}}},
]
CALLS = [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
USER = {"role": "user", "content": "Weather in Paris, and 1 + 2?"}


@pytest.fixture(scope="module")
def hf(model_dir):
    from runtime.tokenizer import Tokenizer

    return Tokenizer(model_dir).hf


def assistant_with_calls(calls):
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)]}


def test_every_template_is_shipped_and_loads_by_name(tmp_path):
    assert set(SHIPPED) == set(FORMATS)
    for name in FORMATS:
        assert load_chat_template(name) == SHIPPED[name].read_text()
    own = tmp_path / "mine.jinja"
    own.write_text("{{ messages[0].content }}")
    assert load_chat_template(str(own)) == "{{ messages[0].content }}"
    with pytest.raises(ValueError, match="neither a file nor a shipped template"):
        load_chat_template("llama4_tools")


@pytest.mark.parametrize("name", list(FORMATS))
def test_rendered_calls_are_what_the_grammar_allows_and_the_parser_reads(name, hf):
    template = SHIPPED[name].read_text()
    fmt = FORMATS[name]
    assert parser_for_template(template).name == fmt  # what --tool-call-parser auto picks
    before = render_chat(hf, [USER], TOOLS, chat_template=template).text
    after = render_chat(hf, [USER, assistant_with_calls(CALLS)], TOOLS, chat_template=template,
                        add_generation_prompt=False).text
    assert after.startswith(before), "the answer continues the prompt"
    turn = after[len(before):]
    for end in ("<|eot_id|>", "<|im_end|>"):  # the turn's end (Mistral's is the eos token)
        turn = turn.split(end)[0]
    grammar = tool_grammar(TOOLS, "required", fmt, parallel=True)
    assert xgr.testing._is_grammar_accept_string(grammar, turn), turn
    content, parsed = parser_for_template(template).parse(turn)
    assert not content and [(c.name, json.loads(c.arguments)) for c in parsed] == CALLS
    # tool results follow; the tools are shown; the template's own markup never names another format
    results = [{"role": "tool", "tool_call_id": "call_0", "content": "18 degrees"},
               {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    text = render_chat(hf, [USER, assistant_with_calls(CALLS), *results], TOOLS, chat_template=template).text
    assert "18 degrees" in text and '"get_weather"' in text and text.index("18 degrees") > text.index(turn)


# How Qwen2.5's and Llama 3.1's own templates write a call: arguments | tojson, with no check
# for a string (the arguments then must be an object, or they are written as a quoted string).
TOJSON_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% for t in tools or [] %}{{ t.function.name }}{% endfor %}"
)


# Mistral's own templates also refuse a call id that is not 9 characters long.
NINE_CHAR_IDS_TEMPLATE = TOJSON_TEMPLATE.replace(
    "{% for c in m.tool_calls or [] %}",
    "{% for c in m.tool_calls or [] %}{% if c.id|length != 9 %}{{ raise_exception('ids have 9 characters') }}{% endif %}")

# Templates that write each argument (Qwen3-Coder's, GLM's) fail on a string.
ITEMS_TEMPLATE = TOJSON_TEMPLATE.replace(
    "{{ c.function.arguments | tojson }}",
    "{{ '{' }}{% for k, v in c.function.arguments | items %}\"{{ k }}\": {{ v | tojson }}{% endfor %}{{ '}' }}")


@pytest.mark.parametrize("name", ["tojson", "tojson, 9-character ids", "items", *FORMATS])
def test_call_arguments_are_written_as_json_objects_by_every_template(name, hf):
    """OpenAI sends a call's arguments as a JSON string: a template that applies tojson to
    them gets them as an object (as vLLM and SGLang give them); the shipped ones, which write
    the string as it is, get the model's own text."""
    own = {"tojson": TOJSON_TEMPLATE, "tojson, 9-character ids": NINE_CHAR_IDS_TEMPLATE, "items": ITEMS_TEMPLATE}
    template = own[name] if name in own else SHIPPED[name].read_text()
    calls = assistant_with_calls(CALLS)
    for k, call in enumerate(calls["tool_calls"]):
        call["id"] = f"call{k:05d}"  # 9 characters
    text = render_chat(hf, [USER, calls], TOOLS, chat_template=template, add_generation_prompt=False).text
    assert '\\"city' not in text and '"city' in text


def test_a_model_template_that_cannot_show_tools_gets_its_formats_shipped_one(hf):
    own = hf.chat_template
    assert tool_template(hf) == SHIPPED["chatml_hermes_tools"].read_text()  # the default model: ChatML
    try:
        hf.chat_template = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}"
        assert tool_template(hf) == SHIPPED["llama3_json_tools"].read_text()
        hf.chat_template = "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"
        assert tool_template(hf) == SHIPPED["mistral_tools"].read_text()
        hf.chat_template = "{% for m in messages %}{{ m.content }}\n{% endfor %}"
        with pytest.raises(ValueError, match="--chat-template"):
            tool_template(hf)
    finally:
        hf.chat_template = own


@pytest.fixture(scope="module")
def llama3_server(tmp_path_factory):
    """A server whose --chat-template is a file (the shipped Llama 3 one, copied)."""
    from runtime.server.server_process import ServerProcess

    path = tmp_path_factory.mktemp("template") / "my_llama3.jinja"
    path.write_text(SHIPPED["llama3_json_tools"].read_text())
    proc = ServerProcess("--chat-template", str(path), "--max-total-tokens", "8000").wait_ready()
    yield proc, path.read_text()
    assert proc.stop() == 0, proc.read_output()


@pytest.mark.slow
def test_chat_template_file_replaces_the_models_template(llama3_server, hf):
    proc, template = llama3_server
    model = "SmolLM2-135M-Instruct"
    plain = httpx.post(proc.url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [USER], "max_tokens": 1}).json()
    want = len(hf.encode(render_chat(hf, [USER], chat_template=template).text))
    assert plain["usage"]["prompt_tokens"] == want  # a chat without tools, through the file's template
    roles = httpx.get(proc.url + "/get_model_info", timeout=30).json()["chat_template_roles"]
    assert roles["user"][0] == "<|start_header_id|>user<|end_header_id|>\n\n"  # the DSL's markers follow it
    resp = httpx.post(proc.url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [USER], "tools": TOOLS, "tool_choice": "required", "temperature": 0,
        "max_tokens": 60, "parallel_tool_calls": False}).json()
    choice = resp["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]
    (call,) = choice["message"]["tool_calls"]  # llama3_json markup, read back by auto's choice
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call["function"]["name"])
    jsonschema.validate(json.loads(call["function"]["arguments"]), schema)


@pytest.mark.slow
def test_a_chat_template_that_is_not_there_fails_at_startup(tmp_path):
    from runtime.server.server_process import ServerProcess

    proc = ServerProcess("--chat-template", str(tmp_path / "missing.jinja"))
    with pytest.raises(RuntimeError, match="--chat-template: .*neither a file nor a shipped template"):
        proc.wait_ready(timeout=120)


@pytest.mark.parametrize("name", ["tojson", *FORMATS])
def test_call_arguments_that_are_not_a_json_object_render_as_written(name, hf):
    """Arguments a client sends back as it got them: cut off by max_tokens (not JSON) or
    empty render, not a 400 (OpenAI accepts any string): a cut-off text as the model wrote
    it, empty arguments as an empty object (as vLLM)."""
    own = {"tojson": TOJSON_TEMPLATE}
    template = own[name] if name in own else SHIPPED[name].read_text()
    calls = assistant_with_calls(CALLS)
    calls["tool_calls"][0]["function"]["arguments"] = '{"city": "Par'
    calls["tool_calls"][1]["function"]["arguments"] = ""
    tool_results = [{"role": "tool", "tool_call_id": f"call_{i}", "content": "ok"} for i in range(2)]
    text = render_chat(hf, [USER, calls, *tool_results], TOOLS, chat_template=template).text
    assert '{"city": "Par' in text or '{\\"city\\": \\"Par' in text
    assert "{}" in text


@pytest.mark.parametrize("key", ["add_generation_prompt", "continue_final_message", "tools", "tokenize", "chat_template"])
def test_chat_template_kwargs_naming_a_render_argument_leave_the_request_fields_in_charge(key, hf):
    """Such a key was a 400 leaking a Python TypeError ("got multiple values for keyword
    argument"); vLLM drops it and the request's own field wins."""
    messages = [{"role": "user", "content": "Hi"}]
    plain = render_chat(hf, messages, add_generation_prompt=False).text
    value = {"tools": [], "chat_template": "{{ 'x' }}"}.get(key, True)
    assert render_chat(hf, messages, add_generation_prompt=False, template_kwargs={key: value}).text == plain
