"""Tool calling through the official ``openai`` client against a real server: a multi-step
loop (``tool_choice`` required, then auto) where every returned call names a declared tool
and its arguments validate against that tool's schema; streaming gives the same calls as
non-streaming; a named ``tool_choice`` and ``allowed_tools`` are obeyed; ``parallel_tool_calls:
false`` gives one call; bad tool requests are 400s."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate a sum of two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -999, "maximum": 999},
                                                        "b": {"type": "integer", "minimum": -999, "maximum": 999}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def run_tool(name: str, args: dict) -> str:
    return f"{args['city']}: 18 degrees, sunny" if name == "get_weather" else str(args["a"] + args["b"])


def check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_a_tool_loop_with_required_then_auto(client):
    messages = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    for step, choice in enumerate(["required", "auto", "auto"]):
        resp = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice=choice,
                                              parallel_tool_calls=False, temperature=0, max_tokens=60)
        msg = resp.choices[0].message
        if step == 0:
            assert resp.choices[0].finish_reason == "tool_calls" and "<tool_call>" not in (msg.content or "")
        if not msg.tool_calls:
            assert msg.content and "<tool_call>" not in msg.content
            break
        check_calls(msg.tool_calls)
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(call.function.name, json.loads(call.function.arguments))})


def test_streaming_gives_the_same_calls(client):
    """Streamed as OpenAI does: a call's first delta has its index, id, type and name, then
    its arguments come in several fragments as the model writes them, adding up to the
    non-streamed arguments (the same greedy call)."""
    kw = dict(model=MODEL, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=60,
              messages=[{"role": "user", "content": "Add 17 and 25."}])
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    names, args, fragments, content, finish = {}, {}, {}, "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            indexes = [d.index for d in choice.delta.tool_calls or []]
            assert len(set(indexes)) == len(indexes), indexes  # one entry per call in a chunk, as OpenAI sends
            for d in choice.delta.tool_calls or []:
                if d.index not in names:  # the first delta of a call (its arguments may begin there)
                    assert d.id and d.type == "function" and d.function.name
                    names[d.index] = d.function.name
                    args[d.index] = d.function.arguments or ""
                elif d.function and d.function.arguments:
                    args[d.index] = args.get(d.index, "") + d.function.arguments
                    fragments[d.index] = fragments.get(d.index, 0) + 1
    assert finish == "tool_calls" and "<tool_call>" not in content
    assert [names[i] for i in sorted(names)] == [c.function.name for c in whole]
    assert [args[i] for i in sorted(args)] == [c.function.arguments for c in whole]
    assert all(n > 1 for n in fragments.values()), fragments
    with client.chat.completions.stream(**kw) as stream:  # the client's own adding up: content null, as whole
        final = stream.get_final_completion().choices[0].message
    assert final.content is None and client.chat.completions.create(**kw).choices[0].message.content is None
    assert [c.function.arguments for c in final.tool_calls] == [c.function.arguments for c in whole]


def test_streamed_logprobs_cover_every_token_while_the_parser_holds_text_back(client):
    """The tool-call parser holds text back (no chunk is sent for it), but the logprobs of
    those tokens still arrive, in later chunks: the same tokens as the non-streamed answer."""
    kw = dict(model=MODEL, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=60,
              messages=[{"role": "user", "content": "Add 17 and 25."}], logprobs=True)
    whole = client.chat.completions.create(**kw).choices[0].logprobs.content
    streamed = [entry for chunk in client.chat.completions.create(**kw, stream=True) for choice in chunk.choices
                for entry in (choice.logprobs.content if choice.logprobs else None) or []]
    assert len(whole) > 10
    assert [e.token for e in streamed] == [e.token for e in whole]


def test_a_named_tool_choice_is_obeyed(client):
    """The named function is called, once; the answer finishes with "stop", as OpenAI's forced
    function does (and vLLM's), streamed or not."""
    kw = dict(model=MODEL, tools=TOOLS, temperature=0, max_tokens=60, parallel_tool_calls=False,
              tool_choice={"type": "function", "function": {"name": "calculator"}},
              messages=[{"role": "user", "content": "What is the weather in Rome?"}])
    resp = client.chat.completions.create(**kw)
    calls = resp.choices[0].message.tool_calls
    check_calls(calls)
    assert [c.function.name for c in calls] == ["calculator"]
    assert resp.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert any(c.choices[0].delta.tool_calls for c in chunks if c.choices)


def test_allowed_tools_keeps_every_tool_in_the_prompt_and_calls_only_the_allowed(server, client):
    """``allowed_tools`` narrows what may be called without changing the prompt (so a program's
    next step keeps its cached prefix): the rendered prompt is the one with every tool, and the
    answer calls the allowed tool, not the one the model picks when both may be called, the
    same call as naming that tool."""
    ask = [{"role": "user", "content": "What is the weather in Rome?"}]
    kw = dict(model=MODEL, messages=ask, tools=TOOLS, temperature=0, max_tokens=60, parallel_tool_calls=False)
    free = client.chat.completions.create(tool_choice="required", **kw).choices[0].message.tool_calls[0].function.name
    (other,) = {"get_weather", "calculator"} - {free}
    only_other = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": other}}]}}

    def render(choice):
        return httpx.post(server.url + "/v1/chat/completions/render", timeout=60, json={
            "model": MODEL, "messages": ask, "tools": TOOLS, "tool_choice": choice}).json()["text"]

    assert render(only_other) == render("required") == render("auto")
    allowed = client.chat.completions.create(tool_choice=only_other, **kw).choices[0].message.tool_calls
    named = client.chat.completions.create(tool_choice={"type": "function", "function": {"name": other}},
                                           **kw).choices[0].message.tool_calls
    check_calls(allowed)
    assert [(c.function.name, c.function.arguments) for c in allowed] == [
        (c.function.name, c.function.arguments) for c in named]
    assert allowed[0].function.name == other
    auto = {"type": "allowed_tools", "allowed_tools": {**only_other["allowed_tools"], "mode": "auto"}}
    for _ in range(2):
        message = client.chat.completions.create(tool_choice=auto, **{**kw, "temperature": 1.0}).choices[0].message
        assert all(c.function.name == other for c in message.tool_calls or [])


def test_parallel_tool_calls_false_gives_one_call(client):
    """Two things asked at once: with parallel_tool_calls false the answer holds exactly one
    call (the grammar ends it there); with the default (true) every call it holds is valid,
    a last one cut off by max_tokens aside (this small model tends to repeat calls)."""
    ask = [{"role": "user", "content": "What is the weather in Oslo in celsius, and what is 2 plus 3?"}]
    one = client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice="required",
                                         parallel_tool_calls=False, temperature=0, max_tokens=120)
    assert one.choices[0].finish_reason == "tool_calls"
    check_calls(one.choices[0].message.tool_calls)
    assert len(one.choices[0].message.tool_calls) == 1
    several = client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice="required",
                                             temperature=0, max_tokens=120)
    calls = several.choices[0].message.tool_calls
    check_calls(calls if several.choices[0].finish_reason != "length" else calls[:-1])


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_call_cut_by_max_tokens_is_returned_as_far_as_written_streamed_or_not(client, tool_choice):
    """OpenAI returns a call max_tokens cut with its arguments as far as they were written
    and finish_reason "length"; the whole answer left it out (an agent saw an empty
    message, while the stream had shown the call)."""
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=TOOLS,
              tool_choice=tool_choice, temperature=0, max_tokens=20)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "length" and whole.message.tool_calls
    cut = whole.message.tool_calls[-1]
    assert cut.function.name in {t["function"]["name"] for t in TOOLS}
    assert cut.function.arguments[:1] in ("", "{")  # as far as written: maybe nothing yet
    with pytest.raises(ValueError):
        json.loads(cut.function.arguments)
    names, arguments = {}, {}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            names[call.index] = names.get(call.index) or call.function.name
            arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == \
           [(names[i], arguments[i]) for i in sorted(names)]


def test_render_gives_the_prompt_grammar_and_parser_a_chat_request_runs_with(server, engine):
    """/v1/chat/completions/render: the prompt the chat route would generate from (the tool
    template's rendering), the call grammar as /generate's ebnf, and the parser; what the
    DSL's native backend uses to make the same tool calls through /generate."""
    from runtime.server.tools.chat_prompt import render_chat
    from runtime.server.tools.parsers import get_parser

    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    body = {"model": MODEL, "messages": messages, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    out = httpx.post(server.url + "/v1/chat/completions/render", json=body, timeout=60).json()
    want = render_chat(engine.tokenizer.hf, messages, TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert out == {"text": want.text, "sampling_params": {"ebnf": want.tool_ebnf}, "tool_call_parser": "hermes"}
    native = httpx.post(server.url + "/generate", timeout=60, json={
        "text": out["text"], "sampling_params": {**out["sampling_params"], "temperature": 0, "max_new_tokens": 60}}).json()
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={**body, "temperature": 0, "max_tokens": 60}).json()
    (call,) = get_parser(out["tool_call_parser"]).parse(native["text"])[1]
    (chat_call,) = chat["choices"][0]["message"]["tool_calls"]  # the same call both ways
    assert (chat_call["function"]["name"], chat_call["function"]["arguments"]) == (call.name, call.arguments)
    plain = httpx.post(server.url + "/v1/chat/completions/render", timeout=60,
                       json={"model": MODEL, "messages": messages}).json()
    assert plain["sampling_params"] == {} and plain["tool_call_parser"] is None
    bad = httpx.post(server.url + "/v1/chat/completions/render", timeout=60,
                     json={"model": MODEL, "messages": messages, "tool_choice": "required"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_choice"


@pytest.mark.parametrize("tools", [None, []])
def test_auto_over_no_tools_is_a_plain_answer(server, tools):
    """Clients send tool_choice "auto" with no tools or an empty list: the answer is the one
    without either field."""
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Name a planet."}], "max_tokens": 8,
           "temperature": 0}
    plain = httpx.post(server.url + "/v1/chat/completions", timeout=60, json=ask).json()
    auto = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                      json={**ask, "tool_choice": "auto", **({"tools": tools} if tools is not None else {})})
    assert auto.status_code == 200, auto.text
    assert auto.json()["choices"][0]["message"] == plain["choices"][0]["message"]
    regex = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                       json={**ask, "tool_choice": "auto", "tools": tools, "regex": "[A-Z][a-z]+"})
    assert regex.status_code == 200, regex.text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "allowed_tools": {
            "mode": "auto", "tools": [{"type": "function", "function": {"name": "nope"}}]}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tools": TOOLS, "regex": "[a-z]+"}, "tools"),
    ],
)
def test_bad_tool_requests_are_400s(server, body, param):
    resp = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **body})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_tools_with_a_json_response_format_answer_with_calls_or_that_json(server):
    """The answer either calls a declared tool or is JSON of the response_format's schema."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40}}, "required": ["answer"],
              "additionalProperties": False}
    for question in ("What is the weather in Paris in celsius?", "Say hello."):
        out = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], tools=TOOLS, temperature=0, max_tokens=80,
            response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}})
        message = out.choices[0].message
        if message.tool_calls:
            check_calls(message.tool_calls)
        else:
            jsonschema.validate(json.loads(message.content), schema)


def test_a_non_strict_tool_is_held_to_the_part_of_its_schema_the_engine_enforces(client):
    """A tool without ``strict`` whose schema has a part the grammar engine cannot enforce
    (``uniqueItems``, as pydantic writes a ``set``) is still served: its calls follow the rest of
    the schema. The same tool marked ``strict`` is a 400 (test_server_errors.py)."""
    tool = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                  "maxItems": 3, "uniqueItems": True}},
        "required": ["tags"], "additionalProperties": False}}}
    resp = client.chat.completions.create(model=MODEL, tools=[tool], tool_choice="required", temperature=0, max_tokens=60,
                                          messages=[{"role": "user", "content": "Tag this: a red apple."}])
    call, *more = resp.choices[0].message.tool_calls
    assert not more or resp.choices[0].finish_reason == "length"  # the model repeats calls: a last one cut
    args = json.loads(call.function.arguments)
    looser = {k: v for k, v in tool["function"]["parameters"]["properties"]["tags"].items() if k != "uniqueItems"}
    jsonschema.validate(args, {**tool["function"]["parameters"], "properties": {"tags": looser}})


def test_a_chat_with_many_tools_does_not_hold_up_other_requests(server):
    """Rendering a chat with thousands of tools (its template and call grammar, seconds of
    work) ran on the HTTP process's event loop: /health waited for all of it (15 s of a 15 s
    render), long enough to fail a liveness probe. It runs on a worker thread now."""
    import threading
    import time

    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "Looks a thing up.",
                                               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
             for i in range(10_000)]
    body = {"messages": [{"role": "user", "content": "Hi"}], "tools": tools}
    render_took: list[float] = []

    def render() -> None:
        began = time.perf_counter()
        assert httpx.post(server.url + "/v1/chat/completions/render", json=body, timeout=300).status_code == 200
        render_took.append(time.perf_counter() - began)

    worker = threading.Thread(target=render)
    worker.start()
    time.sleep(1)  # the body is read and parsed; its rendering has begun
    began = time.perf_counter()
    assert httpx.get(server.url + "/health", timeout=300).status_code == 200
    health_took = time.perf_counter() - began
    worker.join(300)
    assert render_took and health_took < render_took[0] / 4, (health_took, render_took)
