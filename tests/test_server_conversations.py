"""OpenAI's Conversations API against a real server through the official client: a
conversation's items are created, listed, read and deleted; a response given ``conversation``
answers exactly as the same history sent as input would (greedy text and token counts) and
adds its input and output to it; the Agents SDK's ``OpenAIConversationsSession`` keeps an
agent's memory there and a ``Runner`` runs on it; bad ids are 404s (a 400 in a new request)."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def test_items_are_created_listed_read_and_deleted(client):
    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "Hello"}],
                                       metadata={"topic": "greeting"})
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "greeting"}
    assert client.conversations.retrieve(conv.id).model_dump() == conv.model_dump()
    assert client.conversations.update(conv.id, metadata={"topic": "other"}).metadata == {"topic": "other"}
    added = client.conversations.items.create(conv.id, items=[
        {"type": "message", "role": "assistant", "content": "Hi there"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "How are you?"}]}])
    assert len(added.data) == 2
    listed = list(client.conversations.items.list(conv.id, order="asc"))
    assert [(i.role, i.content[0].text) for i in listed] == [
        ("user", "Hello"), ("assistant", "Hi there"), ("user", "How are you?")]
    newest = client.conversations.items.list(conv.id, limit=1)  # desc by default: the newest first
    assert newest.data[0].id == listed[-1].id and newest.has_more
    assert client.conversations.items.retrieve(listed[1].id, conversation_id=conv.id).id == listed[1].id
    client.conversations.items.delete(listed[1].id, conversation_id=conv.id)
    assert [i.id for i in client.conversations.items.list(conv.id, order="asc")] == [listed[0].id, listed[2].id]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(listed[1].id, conversation_id=conv.id)
    client.conversations.delete(conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.BadRequestError):
        client.conversations.create(items=[{"type": "item_reference", "id": "msg_1"}])
    with pytest.raises(openai.BadRequestError, match="at most 20 items"):  # OpenAI's limit per request
        client.conversations.create(items=[{"type": "message", "role": "user", "content": "Hi"}] * 21)


def test_a_response_in_a_conversation_answers_as_its_history_sent_whole_and_joins_it(client):
    conv = client.conversations.create(items=[{"type": "message", "role": "system", "content": "Answer briefly."}])
    kw = dict(model=MODEL, temperature=0, max_output_tokens=16)
    first = client.responses.create(input="Name a planet.", conversation=conv.id, **kw)
    second = client.responses.create(input="Name another one.", conversation={"id": conv.id}, **kw)
    assert second.conversation.id == conv.id
    history = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a planet."},
               {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "Name another one."}]
    whole = client.responses.create(input=history, **kw)
    assert (second.output_text, second.usage.input_tokens) == (whole.output_text, whole.usage.input_tokens)
    items = list(client.conversations.items.list(conv.id, order="asc"))
    assert [(i.type, getattr(i, "role", None)) for i in items] == [
        ("message", "system"), ("message", "user"), ("message", "assistant"), ("message", "user"),
        ("message", "assistant")]
    assert items[-1].id == second.output[-1].id
    with pytest.raises(openai.BadRequestError, match="not both"):
        client.responses.create(input="x", conversation=conv.id, previous_response_id=first.id, **kw)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(input="x", conversation="conv_unknown", **kw)
    assert err.value.body["param"] == "conversation"


def test_pages_ids_and_a_streamed_response_in_a_conversation(client):
    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": f"m{k}", "id": f"msg_{k}"}
                                              for k in range(5)])
    page = client.conversations.items.list(conv.id, order="asc", limit=2, after="msg_1")
    assert [i.id for i in page.data] == ["msg_2", "msg_3"] and page.has_more and page.last_id == "msg_3"
    with pytest.raises(openai.BadRequestError, match="already in the conversation"):
        client.conversations.items.create(conv.id, items=[{"type": "message", "role": "user", "content": "x",
                                                           "id": "msg_4"}])
    with pytest.raises(openai.BadRequestError, match="already in the conversation"):
        client.responses.create(model=MODEL, conversation=conv.id, max_output_tokens=4,
                                input=[{"type": "message", "role": "user", "content": "x", "id": "msg_0"}])
    assert len(list(client.conversations.items.list(conv.id))) == 5  # nothing was added by either
    events = list(client.responses.create(model=MODEL, conversation=conv.id, input="Go on.", max_output_tokens=6,
                                          temperature=0, stream=True))
    answer = events[-1].response
    items = list(client.conversations.items.list(conv.id, order="asc"))
    assert [i.id for i in items[5:]] == [items[5].id, *[o.id for o in answer.output]]
    assert items[5].content[0].text == "Go on." and len(items) == 6 + len(answer.output)


def test_the_agents_sdk_keeps_an_agents_memory_in_a_conversation(server):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIConversationsSession,
        OpenAIResponsesModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)

    async def run() -> tuple[list, list, object]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x")
        session = OpenAIConversationsSession(openai_client=client)
        await session.add_items([{"role": "user", "content": "My name is Ada."},
                                 {"role": "assistant", "content": "Hello Ada."}])
        before = await session.get_items()
        agent = Agent(name="a", instructions="Be brief.", model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                      model_settings=ModelSettings(temperature=0, max_tokens=120))
        result = await Runner.run(agent, "What is my name?", session=session)
        after = await session.get_items()
        popped = await session.pop_item()
        await session.clear_session()
        return before, after, (result.final_output, popped)

    before, after, (final_output, popped) = asyncio.run(run())
    assert [i["role"] for i in before] == ["user", "assistant"]
    assert len(after) == 4 and after[2]["role"] == "user" and isinstance(final_output, str) and final_output
    assert popped is not None and popped == after[-1]  # the last item: the agent's answer


def test_a_conversation_runs_one_response_at_a_time(client):
    """While a response runs on a conversation (streamed, or in the background) another one
    on it is a 400 ``conversation_locked``, as OpenAI answers; once it has ended, the next
    one continues from its items."""
    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "Count to fifty."}])
    kw = dict(model=MODEL, conversation=conv.id, temperature=0)
    with client.responses.create(input="Go.", max_output_tokens=64, stream=True, **kw) as stream:
        first = next(iter(stream))
        assert first.type == "response.created"
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(input="Stop.", max_output_tokens=4, **kw)
        assert err.value.code == "conversation_locked" and err.value.param == "conversation"
        answer = [e for e in stream if e.type in ("response.completed", "response.incomplete")][0].response
    after = client.responses.create(input="Stop.", max_output_tokens=4, **kw)
    assert after.usage.input_tokens > answer.usage.input_tokens + answer.usage.output_tokens
    running = client.responses.create(input="Again.", max_output_tokens=256, background=True, **kw)
    with pytest.raises(openai.BadRequestError, match=running.id):
        client.responses.create(input="Stop.", max_output_tokens=4, **kw)
    assert client.responses.cancel(running.id).status == "cancelled"
    assert client.responses.create(input="Stop.", max_output_tokens=4, **kw).status in ("completed", "incomplete")


def test_a_response_whose_client_left_adds_nothing_to_the_conversation(client, server):
    """A response (not streamed) on a conversation whose client leaves while it runs: it is
    aborted, neither its input nor a (cut short) answer joins the conversation, and the hold
    is released."""
    from tests.server_probes import ABORTED, LONG_RESPONSE, metric, post_and_leave, wait_for_aborts

    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "Hello."}])
    aborted = metric(server, ABORTED)
    post_and_leave(server, "/v1/responses", {"model": MODEL, "conversation": conv.id, **LONG_RESPONSE})
    wait_for_aborts(server, aborted)
    _respond_when_released(client, conv.id)
    texts = [part.text for item in client.conversations.items.list(conv.id, order="asc") if item.type == "message"
             for part in item.content]
    assert texts[:2] == ["Hello.", "Stop."]


def test_a_response_ended_by_abort_request_is_cancelled_and_kept_out_of_the_conversation(client, server):
    import concurrent.futures

    import httpx

    from tests.server_probes import LONG_RESPONSE

    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "Hello."}])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(client.responses.create, model=MODEL, conversation=conv.id, **LONG_RESPONSE)
        deadline = time.monotonic() + 30
        while server.info()["scheduler"]["num_running_reqs"] == 0:
            assert time.monotonic() < deadline, "the response never started"
            time.sleep(0.05)
        assert httpx.post(server.url + "/abort_request", json={"abort_all": True}).status_code == 200
        answer = running.result(timeout=60)
    assert answer.status == "cancelled"
    assert client.responses.retrieve(answer.id).status == "cancelled"
    texts = [part.text for item in client.conversations.items.list(conv.id, order="asc") if item.type == "message"
             for part in item.content]
    assert texts == ["Hello."]


def _respond_when_released(client, conversation: str):
    """A short response on ``conversation`` once its hold is released (at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return client.responses.create(model=MODEL, conversation=conversation, input="Stop.", max_output_tokens=4)
        except openai.BadRequestError as err:  # released a moment after the abort, not after the lapse
            assert err.code == "conversation_locked" and time.monotonic() < deadline, err
            time.sleep(0.2)


def test_a_stream_whose_client_left_first_releases_the_conversation(client, server):
    """A streamed response on a conversation whose client closes the connection before
    reading a byte: its hold is released at once (not after the 30 s lapse), so the next
    response on the conversation runs."""
    from tests.server_probes import ABORTED, LONG_RESPONSE, metric, post_and_leave, wait_for_aborts

    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "Hello."}])
    aborted = metric(server, ABORTED)
    post_and_leave(server, "/v1/responses", {"model": MODEL, "conversation": conv.id, "stream": True, **LONG_RESPONSE})
    wait_for_aborts(server, aborted)  # it ran, held the conversation, and was aborted
    assert _respond_when_released(client, conv.id).status in ("completed", "incomplete")
