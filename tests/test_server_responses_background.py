"""Background responses (``background: true``) of OpenAI's Responses API through the
``openai`` client against a real server: the foreground answer later, a stream that resumes
with the same events, cancelling, and a stopping server storing the unfinished ones as failed."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x")


def _until_ended(client, response_id: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while (r := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, r
        time.sleep(0.2)
    return r


def _until_some_output(client, response_id: str, timeout: float = 60) -> None:
    """Until a running background response has output (so that it is well under way)."""
    deadline = time.monotonic() + timeout
    while not (r := client.responses.retrieve(response_id)).output:
        assert r.status == "in_progress" and time.monotonic() < deadline, r
        time.sleep(0.05)


def _nothing_running(server) -> bool:
    return httpx.get(server.url + "/get_load", timeout=30).json()[0]["num_reqs"] == 0


def test_a_background_response_is_the_foreground_answer_later(client):
    kw = dict(model=MODEL, input="Name three planets.", temperature=0, max_output_tokens=24)
    started = client.responses.create(background=True, **kw)
    assert started.background and started.status == "in_progress" and started.output == []
    ended = _until_ended(client, started.id)
    foreground = client.responses.create(**kw)
    assert ended.status == foreground.status and ended.output_text == foreground.output_text
    assert ended.usage.output_tokens == foreground.usage.output_tokens
    then = client.responses.create(model=MODEL, input="And a fourth?", previous_response_id=started.id,
                                   temperature=0, max_output_tokens=8)
    assert then.usage.input_tokens > ended.usage.input_tokens  # it continued the stored conversation


def test_a_background_stream_resumes_with_the_same_events(client):
    kw = dict(model=MODEL, input="Name three planets.", temperature=0, max_output_tokens=24, background=True)
    live = list(client.responses.create(stream=True, **kw))
    ended = live[-1].response
    assert ended.status in ("completed", "incomplete") and ended.background
    assert client.responses.retrieve(ended.id).model_dump() == ended.model_dump()
    again = list(client.responses.retrieve(ended.id, stream=True, starting_after=4))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in live[5:]]  # the run's own numbering
    # a client that goes away does not stop it
    with httpx.stream("POST", client.base_url.join("responses").__str__(), timeout=60,
                      json={**kw, "input": "Name four planets.", "stream": True}) as resp:
        first = next(line for line in resp.iter_lines() if line.startswith("data: "))
    response_id = json.loads(first[6:])["response"]["id"]
    assert _until_ended(client, response_id).output_text


def test_cancelling_a_background_response_stops_it(server, client):
    long = dict(model=MODEL, input="Count from 1 to 400, separated by commas.", temperature=0,
                max_output_tokens=1500)
    started = client.responses.create(background=True, **long)
    with pytest.raises(openai.BadRequestError, match="still in progress"):
        client.responses.create(model=MODEL, input="Go on.", previous_response_id=started.id)
    with pytest.raises(openai.BadRequestError, match="cancel it first"):
        client.responses.delete(started.id)
    _until_some_output(client, started.id)
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled" and cancelled.id == started.id
    assert client.responses.retrieve(started.id).status == "cancelled"
    assert client.responses.cancel(started.id).status == "cancelled"  # again: the same answer
    deadline = time.monotonic() + 30
    while not _nothing_running(server):  # its requests were aborted: nothing left on the scheduler
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(openai.BadRequestError, match="ended cancelled"):
        client.responses.create(model=MODEL, input="Go on.", previous_response_id=started.id)
    events = list(client.responses.retrieve(started.id, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert done and [i.status for i in done] == [i.status for i in cancelled.output] == ["incomplete"] * len(done)
    assert events[-1].type == "response.output_item.done"  # no event of its end
    foreground = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError, match="only background responses"):
        client.responses.cancel(foreground.id)
    with pytest.raises(openai.BadRequestError, match="needs 'store' true"):
        client.responses.create(model=MODEL, input="Hi", background=True, store=False)
    client.responses.delete(started.id)


def test_a_stopping_server_stores_its_unfinished_background_responses_as_failed(tmp_path):
    """With --response-store the stored responses outlive the server: one that was still
    running when the server stopped (SIGTERM) is there as failed, not in progress forever;
    the finished one is there whole."""
    from runtime.server.response_store import ResponseStore, SqliteTable
    from runtime.server.server_process import ServerProcess

    path = str(tmp_path / "responses.sqlite")
    proc = ServerProcess("--response-store", path, "--max-total-tokens", "4000").wait_ready()
    try:
        c = openai.OpenAI(base_url=proc.url + "/v1", api_key="x")
        finished = c.responses.create(model=MODEL, input="Name a planet.", max_output_tokens=6, temperature=0)
        running = c.responses.create(model=MODEL, input="Count from 1 to 400, separated by commas.",
                                     max_output_tokens=1500, temperature=0, background=True)
        _until_some_output(c, running.id)
    finally:
        assert proc.stop() == 0, proc.read_output()
    store = ResponseStore(table=SqliteTable(path, "responses"))
    assert store.response(finished.id)["output"][0]["content"][0]["text"] == finished.output_text
    left = store.response(running.id)
    assert left["status"] == "failed" and "stopped" in left["error"]["message"], left


def test_a_stored_stream_can_be_read_while_it_runs_and_is_stored_cancelled_when_its_client_leaves(server, client):
    """Its id comes in its first event: a GET then says in progress (not 404), and once the
    client has gone the response is there as cancelled, its cut item incomplete, its
    requests aborted; only background responses are cancelled through the API."""
    body = dict(model=MODEL, input="Count from 1 to 400, separated by commas.", temperature=0,
                max_output_tokens=1500, stream=True)
    with httpx.stream("POST", str(client.base_url.join("responses")), json=body, timeout=60) as resp:
        lines = (line for line in resp.iter_lines() if line.startswith("data: "))
        response_id = json.loads(next(lines)[6:])["response"]["id"]
        assert client.responses.retrieve(response_id).status == "in_progress"
        with pytest.raises(openai.BadRequestError, match="only background responses"):
            client.responses.cancel(response_id)
        with pytest.raises(openai.BadRequestError, match="delete it once it has ended"):
            client.responses.delete(response_id)
        next(line for line in lines if "output_text.delta" in line)
    ended = _until_ended(client, response_id)
    assert ended.status == "cancelled" and not ended.background
    assert ended.output and ended.output[-1].status == "incomplete" and ended.output_text
    deadline = time.monotonic() + 30
    while not _nothing_running(server):
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_an_answer_ended_by_abort_request_has_its_cut_item_incomplete(server, client):
    def abort_soon() -> None:
        time.sleep(1.5)
        httpx.post(server.url + "/abort_request", json={"abort_all": True}, timeout=30)

    aborter = threading.Thread(target=abort_soon)
    aborter.start()
    ended = client.responses.create(model=MODEL, input="Count from 1 to 400, separated by commas.", temperature=0,
                                    max_output_tokens=1500)
    aborter.join()
    assert ended.status == "cancelled" and ended.output_text
    assert ended.output[-1].status == "incomplete"
