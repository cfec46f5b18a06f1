"""OpenAI's Responses API (``/v1/responses``) through the official ``openai`` client against a
real server, with the chat route as the oracle: the same conversation as chat messages gives
the same greedy text and token counts; streaming events add up to the non-streamed answer;
``previous_response_id`` continues the stored conversation exactly as the whole history sent
as chat would; function calls come back as ``function_call`` items and their outputs go back
in; what the server cannot do is a 400 that says so."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": False}}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x")


def chat_text(client, messages, **kw) -> tuple[str, object]:
    out = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)
    return out.choices[0].message.content, out.usage


def test_a_response_is_the_chat_answer_to_the_same_messages(client):
    r = client.responses.create(model=MODEL, instructions="Answer in one line.", input="Name three planets.",
                                temperature=0, max_output_tokens=40)
    text, usage = chat_text(client, [{"role": "system", "content": "Answer in one line."},
                                     {"role": "user", "content": "Name three planets."}], max_tokens=40)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.output_text == text and text
    assert (r.usage.input_tokens, r.usage.output_tokens) == (usage.prompt_tokens, usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status == ("incomplete" if r.usage.output_tokens == 40 else "completed")


def test_streamed_events_add_up_to_the_whole_answer(client):
    kw = dict(model=MODEL, input=[{"role": "user", "content": "Count to five."}], temperature=0, max_output_tokens=200)
    whole = client.responses.create(**kw)
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text and deltas
    done = next(e for e in events if e.type == "response.output_text.done")
    assert len(final.output[0].content[0].logprobs) == 0  # not asked for
    assert done.text == deltas and done.item_id == final.output[0].id
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert whole.status != "completed" or whole.completed_at >= whole.created_at
    assert final.status != "completed" or final.completed_at >= final.created_at


def test_streamed_events_are_named_on_event_lines(server):
    """As OpenAI sends them: each event's ``event:`` line names its type (clients such as an
    EventSource dispatch on it)."""
    body = {"model": MODEL, "input": "Say hi.", "stream": True, "max_output_tokens": 8, "store": False}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as resp:
        frames = [f for f in resp.read().decode().split("\n\n") if f.strip()]
    assert len(frames) > 3
    for frame in frames:
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[len("data: "):])["type"] == name[len("event: "):]


def test_previous_response_id_continues_the_stored_conversation(client):
    first = client.responses.create(model=MODEL, input="Name a planet.", temperature=0, max_output_tokens=30)
    second = client.responses.create(model=MODEL, input="Name another one.", previous_response_id=first.id,
                                     temperature=0, max_output_tokens=30)
    history = [{"role": "user", "content": "Name a planet."}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "Name another one."}]
    text, usage = chat_text(client, history, max_tokens=30)
    assert second.output_text == text
    assert second.usage.input_tokens == usage.prompt_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0  # the first call's prompt was reused
    assert second.previous_response_id == first.id
    # stored: read back, its input items listed (this request's own, newest first), then deleted
    assert client.responses.retrieve(first.id).output_text == first.output_text
    items = client.responses.input_items.list(second.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "Name another one.")]
    several = client.responses.create(model=MODEL, input=[{"role": "user", "content": "A"},
                                                          {"role": "assistant", "content": "B"},
                                                          {"role": "user", "content": "C"}], max_output_tokens=2)
    page = client.responses.input_items.list(several.id, limit=2, order="asc")
    assert [i.content[0].text for i in page.data] == ["A", "B"] and page.has_more
    rest = client.responses.input_items.list(several.id, order="asc", after=page.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["C"] and not rest.has_more
    assert [i.content[0].text for i in client.responses.input_items.list(several.id).data] == ["C", "B", "A"]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="No stored response"):
        client.responses.create(model=MODEL, input="Go on.", previous_response_id=first.id)
    # store=false keeps nothing
    unstored = client.responses.create(model=MODEL, input="Hi", store=False, max_output_tokens=5)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_function_calls_and_their_outputs_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(model=MODEL, input=ask, tools=[TOOL], tool_choice="required",
                                parallel_tool_calls=False, temperature=0, max_output_tokens=80)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), TOOL["parameters"])
    # the same call as the chat route makes it
    chat = client.chat.completions.create(model=MODEL, messages=ask, tools=[CHAT_TOOL], tool_choice="required",
                                          parallel_tool_calls=False, temperature=0, max_tokens=80)
    chat_call = chat.choices[0].message.tool_calls[0]
    assert (chat_call.function.name, chat_call.function.arguments) == (calls[0].name, calls[0].arguments)
    # streamed, the argument deltas add up to the same call
    with client.responses.stream(model=MODEL, input=ask, tools=[TOOL], tool_choice="required",
                                 parallel_tool_calls=False, temperature=0, max_output_tokens=80) as stream:
        events = list(stream)
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert pieces == calls[0].arguments
    # the tool's output goes back in; the answer is the chat route's to the same history
    follow = [*ask, {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
                     "arguments": calls[0].arguments},
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees, sunny"}]
    answer = client.responses.create(model=MODEL, input=follow, tools=[TOOL], temperature=0, max_output_tokens=40)
    text, _ = chat_text(client, [*ask, {"role": "assistant", "content": "", "tool_calls": [
        {"id": calls[0].call_id, "type": "function", "function": {"name": calls[0].name, "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": "18 degrees, sunny"}],
        tools=[CHAT_TOOL], max_tokens=40)
    assert answer.output_text == text


def test_allowed_tools_in_the_responses_form_is_the_chat_routes(client):
    """The Responses form of allowed_tools: the call is of the allowed tool (not the one the
    model picks when both may be called), the same call as the chat route's."""
    calculator = {"type": "function", "name": "calculator", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model=MODEL, input=ask, tools=[TOOL, calculator], parallel_tool_calls=False, temperature=0,
              max_output_tokens=60)

    def call_of(response):
        (call,) = [o for o in response.output if o.type == "function_call"]
        return call

    free = call_of(client.responses.create(tool_choice="required", **kw)).name
    (other,) = {"get_weather", "calculator"} - {free}
    call = call_of(client.responses.create(**kw, tool_choice={
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": other}]}))
    chat = client.chat.completions.create(
        model=MODEL, messages=ask, parallel_tool_calls=False, temperature=0, max_tokens=60,
        tools=[CHAT_TOOL, {"type": "function", "function": {k: v for k, v in calculator.items() if k != "type"}}],
        tool_choice={"type": "function", "function": {"name": other}})
    chat_call = chat.choices[0].message.tool_calls[0]
    assert call.name == other
    assert (call.name, call.arguments) == (chat_call.function.name, chat_call.function.arguments)


@pytest.mark.parametrize("kw", [dict(tools=[TOOL], tool_choice="required"), dict(include=["message.output_text.logprobs"])],
                         ids=["call", "text"])
def test_a_stored_response_streams_again_as_its_events(client, kw):
    """``GET /v1/responses/{id}?stream=true`` (the client's ``retrieve(..., stream=True)``): the
    events of the stored response, numbered from 0, ending with it as stored; text and call
    arguments add up to its items; ``starting_after`` resumes after that event. The oracle is
    the stored response itself and the events of the stream that created it."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with client.responses.stream(model=MODEL, input=ask, temperature=0, max_output_tokens=40, **kw) as stream:
        live = list(stream)
    created = live[-1].response
    stored = client.responses.retrieve(created.id)
    events = list(client.responses.retrieve(created.id, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response." + stored.status
    assert events[-1].response.model_dump() == stored.model_dump() == created.model_dump()
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.model_dump() for i in done] == [i.model_dump() for i in stored.output]
    live_done = [e.item.model_dump() for e in live if e.type == "response.output_item.done"]
    assert [i.model_dump() for i in done] == live_done
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == stored.output_text
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == "".join(i.arguments for i in stored.output if i.type == "function_call")
    resumed = list(client.responses.retrieve(created.id, stream=True, starting_after=2))
    assert [e.model_dump() for e in resumed] == [e.model_dump() for e in events[3:]]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_unknown", stream=True)


def test_truncation_auto_drops_the_earliest_turns_that_do_not_fit(server):
    """On a server with an 80-token context, a conversation that does not fit is a 400
    unless ``truncation`` is ``auto``; then the answer is the one to the fewest trailing
    turns that fit (with the instructions and a leading system message), sent whole: same
    greedy text and input tokens."""
    from runtime.server.server_process import ServerProcess

    turns = [("What is the capital of France?", "Paris is the capital of France, and its largest city."),
             ("And of Italy?", "Rome is the capital of Italy; it lies on the Tiber."),
             ("And of Spain?", "Madrid is the capital of Spain, in the centre of the country.")]
    system = [{"role": "system", "content": "Capitals."}]
    history = [m for q, a in turns for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]
    kw = dict(model=MODEL, instructions="Answer in one short sentence.", max_output_tokens=8, temperature=0)
    proc = ServerProcess("--max-context-len", "80", "--max-total-tokens", "4000").wait_ready()
    try:
        c = openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0)
        question = [{"role": "user", "content": "And of Portugal?"}]
        with pytest.raises(openai.BadRequestError, match="maximum context length is 80"):
            c.responses.create(input=[*system, *history, *question], **kw)
        cut = c.responses.create(input=[*system, *history, *question], truncation="auto", **kw)
        assert cut.truncation == "auto" and cut.usage.input_tokens + 8 <= 80
        fitting = [k for k in range(0, len(history) + 1, 2) if _fits(c, [*system, *history[k:], *question], kw)]
        assert fitting and fitting[0] > 0  # some turns had to go
        whole = c.responses.create(input=[*system, *history[fitting[0]:], *question], **kw)
        assert (cut.output_text, cut.usage.input_tokens) == (whole.output_text, whole.usage.input_tokens)
        with pytest.raises(openai.BadRequestError, match="maximum context length"):  # one turn that cannot fit
            c.responses.create(input="word " * 200, truncation="auto", **kw)
    finally:
        assert proc.stop() == 0, proc.read_output()


def _fits(client, messages, kw) -> bool:
    try:
        client.responses.create(input=messages, **kw)  # (with room for the same max_output_tokens)
    except openai.BadRequestError:
        return False
    return True


def test_reasoning_effort_is_moot_for_a_model_that_does_not_reason(client):
    r = client.responses.create(model=MODEL, input="Hi", reasoning={"effort": "high"}, max_output_tokens=4)
    assert r.status in ("completed", "incomplete") and r.reasoning.effort == "high"
    assert not [o for o in r.output if o.type == "reasoning"]


def test_a_json_schema_text_format_constrains_the_output(client):
    schema = {"type": "object", "properties": {"planet": {"type": "string", "maxLength": 12}},
              "required": ["planet"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Name a planet as JSON.", temperature=0, max_output_tokens=40,
                                text={"format": {"type": "json_schema", "name": "planet", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_logprobs_are_the_chat_routes(client):
    r = client.responses.create(model=MODEL, input="Name a planet.", temperature=0, max_output_tokens=8,
                                include=["message.output_text.logprobs"], top_logprobs=2)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a planet."}],
                                          temperature=0, max_tokens=8, logprobs=True, top_logprobs=2)
    got = [(lp.token, lp.logprob, [t.token for t in lp.top_logprobs]) for lp in r.output[0].content[0].logprobs]
    want = [(lp.token, lp.logprob, [t.token for t in lp.top_logprobs]) for lp in chat.choices[0].logprobs.content]
    # the same tokens; the values to rounding (one of the two prompts may come from the cache,
    # computed in other chunks)
    assert [(t, top) for t, _, top in got] == [(t, top) for t, _, top in want] and len(got) == r.usage.output_tokens
    assert [lp for _, lp, _ in got] == pytest.approx([lp for _, lp, _ in want], abs=1e-3)
    with client.responses.stream(model=MODEL, input="Name a planet.", temperature=0, max_output_tokens=8,
                                 include=["message.output_text.logprobs"], top_logprobs=2) as stream:
        list(stream)
        streamed = stream.get_final_response() if r.status == "completed" else None
    if streamed is not None:
        streamed_logprobs = streamed.output[0].content[0].logprobs
        assert [lp.token for lp in streamed_logprobs] == [g[0] for g in got]
        assert [lp.logprob for lp in streamed_logprobs] == pytest.approx([g[1] for g in got], abs=1e-3)


def test_a_call_cut_off_by_max_output_tokens_is_left_out_of_the_stored_conversation(client):
    with client.responses.stream(model=MODEL, input="What is the weather in Paris?", tools=[TOOL],
                                 tool_choice="required", temperature=0, max_output_tokens=20) as stream:
        events = list(stream)
    incomplete = events[-1]
    assert incomplete.type == "response.incomplete"
    calls = [item for item in incomplete.response.output if item.type == "function_call"]
    assert calls and calls[-1].status == "incomplete"
    assert all(item.status == "completed" for item in calls[:-1])  # whole ones
    with pytest.raises(ValueError):
        json.loads(calls[-1].arguments)  # streamed as far as it got
    follow = client.responses.create(model=MODEL, input="Never mind.", previous_response_id=incomplete.response.id,
                                     temperature=0, max_output_tokens=8)
    assert follow.status in ("completed", "incomplete")


@pytest.mark.parametrize("max_output_tokens", [14, 22, 30, 38])
def test_an_answer_cut_by_max_output_tokens_is_the_same_streamed_or_not(client, max_output_tokens):
    """Whole or streamed, the same items with the same statuses: the item the limit cut is
    incomplete, the ones before it completed, a call whose arguments are whole is completed
    (its closing markup may be what was cut); a last call cut inside its arguments is an
    incomplete item, streamed or not (the whole answer left it out: an empty output)."""
    kw = dict(model=MODEL, input="What is the weather in Paris and in Rome?", tools=[TOOL], tool_choice="required",
              temperature=0, max_output_tokens=max_output_tokens)
    whole = client.responses.create(**kw)
    with client.responses.stream(**kw) as stream:
        streamed = list(stream)[-1].response

    def items(response):
        return [(o.type, o.status, getattr(o, "arguments", None)) for o in response.output]

    assert whole.status == streamed.status
    assert items(whole) == items(streamed)
    calls = [(status, arguments) for kind, status, arguments in items(whole) if kind == "function_call"]
    assert all(status == "completed" for status, _ in calls[:-1])
    assert [status == "completed" for status, _ in calls[-1:]] == [_is_json_object(a) for _, a in calls[-1:]]


def test_structured_output_beside_tools_is_calls_or_that_json(client):
    """The Agents SDK's pattern for an agent with tools and an output type: text.format and
    tools together; the answer calls the tool or is JSON of the schema."""
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40}}, "required": ["answer"],
              "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[TOOL], temperature=0,
                                max_output_tokens=80, parallel_tool_calls=False,
                                text={"format": {"type": "json_schema", "name": "final_output", "schema": schema}})
    calls = [o for o in r.output if o.type == "function_call"]
    if calls:
        jsonschema.validate(json.loads(calls[0].arguments), TOOL["parameters"])
    else:
        jsonschema.validate(json.loads(r.output_text), schema)


def test_running_out_of_tokens_is_an_incomplete_response(client):
    r = client.responses.create(model=MODEL, input="Tell me a long story.", temperature=0, max_output_tokens=4)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 4


@pytest.mark.parametrize("body,param,words", [
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]", "function tools only"),
    ({"input": "hi", "tools": [TOOL, {"type": "function"}]}, "tools[1].name", "needs a name"),  # not the chat route's path
    ({"input": "hi", "tools": [{**TOOL, "name": "my tool"}]}, "tools[0].name", "'my tool'"),
    ({"input": "hi", "tools": [{**TOOL, "name": "get\n"}]}, "tools[0].name", "needs a name"),  # "$" alone lets a newline end it
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "item_reference"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0]", "text only"),
    ({"input": "hi", "tool_choice": {"type": "web_search_preview"}}, "tool_choice", "not supported"),
    ({"input": "hi", "tools": [TOOL], "tool_choice": {"type": "allowed_tools", "mode": "auto",
                                                      "tools": [{"type": "mcp", "server_label": "x"}]}},
     "tool_choice", "not supported"),
    ({"input": "hi", "tools": [TOOL], "tool_choice": {"type": "allowed_tools", "mode": "auto",
                                                      "tools": [{"type": "function", "name": "nope"}]}},
     "tool_choice", "not one of the given tools"),
    ({"input": []}, "input", "at least one item"),
    ({"input": "hi", "tools": [{**TOOL, "parameters": "x"}]}, "tools[0].parameters", "valid dictionary"),
    ({"input": "hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice",
     "names 'nope', which is not one of the given tools"),
    ({"input": "hi", "include": ["bogus.value"]}, "include[0]", "message.output_text.logprobs"),  # OpenAI's values
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "needs its 'schema'"),
    ({"input": "hi", "previous_response_id": ""}, "previous_response_id", "at least 1 character"),
    ({"input": [{"role": "user", "content": "hi"},  # an output that answers no call (as OpenAI refuses it)
                {"type": "function_call_output", "call_id": "nope", "output": "3"}]},
     "input", "no function call with call_id 'nope'"),
])
def test_what_the_server_cannot_do_is_a_400_naming_the_field(server, body, param, words):
    r = httpx.post(server.url + "/v1/responses", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_an_unknown_model_is_a_404(server):
    r = httpx.post(server.url + "/v1/responses", json={"model": "gpt-9", "input": "hi"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_input_tokens_count_the_prompt_a_response_would_take(server, client, engine):
    body = {"instructions": "Answer in one line.", "input": "Name three planets."}
    counted = httpx.post(server.url + "/v1/responses/input_tokens", json=body).json()  # model may be left out
    messages = [{"role": "system", "content": body["instructions"]}, {"role": "user", "content": body["input"]}]
    hf_ids = engine.tokenizer.hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    hf_ids = hf_ids if isinstance(hf_ids, list) else hf_ids["input_ids"]
    assert counted == {"object": "response.input_tokens", "input_tokens": len(hf_ids)}  # HF's own tokenization
    with_tools = {**body, "tools": [TOOL]}
    r = client.responses.create(model=MODEL, max_output_tokens=1, **with_tools)
    assert client.responses.input_tokens.count(model=MODEL, **with_tools).input_tokens == r.usage.input_tokens
    resp = httpx.post(server.url + "/v1/responses/compact", json={"model": MODEL, "input": "Hi"})
    assert resp.status_code == 404 and "truncation" in resp.json()["error"]["message"]


def test_input_may_be_left_out_after_a_previous_response(client):
    first = client.responses.create(model=MODEL, input="Name a planet.", temperature=0, max_output_tokens=8)
    again = client.responses.create(model=MODEL, previous_response_id=first.id, temperature=0, max_output_tokens=8)
    assert again.usage.input_tokens > first.usage.input_tokens  # the stored turns, the answer included
    with pytest.raises(openai.BadRequestError, match="may be left out only after"):
        client.responses.create(model=MODEL, max_output_tokens=8)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
