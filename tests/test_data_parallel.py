"""``forkserve serve --dp-size 2``: two replicas behind the real SGLang model gateway
(``sglang-router``, in the test extra). One instance serves the whole module; the last two
tests kill one of its replicas and then stop it, so they stay last."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import SERVER_ENGINE_ARGS
from tests.proc_utils import descendants, pid_alive

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0, "max_tokens": 12}
MODEL = "SmolLM2-135M-Instruct"
# A short health-check interval so that a dead replica is noticed within seconds.
DP_ARGS = ("--dp-size", "2", "--router-health-check-interval", "1", *SERVER_ENGINE_ARGS)


@pytest.fixture(scope="module")
def dp():
    from runtime.server.server_process import ServerProcess

    proc = ServerProcess(*DP_ARGS)
    try:
        # The gateway answers /health_generate once one replica is healthy; the launcher's
        # own ready line (not a replica's, which are tagged) comes when both are.
        proc.wait_ready(timeout=300)
        deadline = time.monotonic() + 60
        while not re.search(r"^forkserve ready:", proc.read_output(), re.M) and time.monotonic() < deadline:
            time.sleep(0.2)
        replicas = re.findall(r"^forkserve: replica \d at (http://[\d.:]+) \(pid (\d+)\)", proc.read_output(), re.M)
        assert len(replicas) == 2, proc.output
        assert re.search(rf"^forkserve ready: http://\S+ \(model {MODEL}; 2 replicas", proc.output, re.M), proc.output
        proc.replicas = [(url, int(pid)) for url, pid in replicas]
        yield proc
    finally:
        proc.stop()


def _chat(base_url: str, messages: list[dict], stream: bool) -> str:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="none")
    if not stream:
        out = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
        return out.choices[0].message.content
    chunks = client.chat.completions.create(model=MODEL, messages=messages, stream=True, **GREEDY)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _generate(base_url: str, text: str, stream: bool) -> tuple[str, list[int]]:
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 12}, "stream": stream}
    if not stream:
        out = httpx.post(base_url + "/generate", json=body, timeout=60).json()
        return out["text"], out["output_ids"]
    last = None
    with httpx.stream("POST", base_url + "/generate", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                last = httpx.Response(200, content=line[6:]).json()
    assert last is not None
    return last["text"], last["output_ids"]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_client_and_generate_through_the_gateway_equal_a_single_server(dp, server, stream):
    for i, question in enumerate(["Name three planets.", "What is the capital of France?"]):
        messages = [{"role": "user", "content": question}]
        assert _chat(dp.url, messages, stream) == _chat(server.url, messages, stream), (i, stream)
        prompt = f"Question: {question}\nAnswer:"
        assert _generate(dp.url, prompt, stream) == _generate(server.url, prompt, stream), (i, stream)


def _finished(replica_url: str) -> int:
    """Requests the replica finished (its metric, which leaves out the gateway's health probes)."""
    lines = httpx.get(replica_url + "/metrics", timeout=30).text.splitlines()
    return int(float(next(line for line in lines if line.startswith("forkserve:requests_finished_total{")).rsplit(" ", 1)[1]))


def _load(replica_url: str) -> int:
    return httpx.get(replica_url + "/get_load", timeout=30).json()[0]["num_reqs"]


def test_cache_aware_keeps_each_conversation_on_one_replica_and_spreads_them(dp):
    """Two multi-turn programs at once: each call after the first finds the whole previous
    prompt cached (only the replica that served it has it), and the programs use both."""
    before = [_finished(url) for url, _ in dp.replicas]
    client = openai.OpenAI(base_url=dp.url + "/v1", api_key="none")
    turns = 3
    usage: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
    systems = {"a": "You are a ship's navigator who answers with bearings and distances in nautical miles.",
               "b": "Du bist ein Koch, der jede Frage mit einem Rezept und einer Zutatenliste beantwortet."}

    def program(name: str) -> None:
        messages = [{"role": "system", "content": systems[name]}]
        for t in range(turns):
            messages.append({"role": "user", "content": f"Question {t + 1} of program {name}: and then?"})
            out = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=16)
            details = out.usage.prompt_tokens_details
            usage[name].append((out.usage.prompt_tokens, details.cached_tokens if details else 0))
            messages.append({"role": "assistant", "content": out.choices[0].message.content})

    first = threading.Thread(target=program, args=("a",))
    first.start()
    # b starts once a's first call runs, so that the gateway sends b's first call to the
    # less loaded replica (the two share too little text for a prefix match)
    deadline = time.monotonic() + 30
    while not any(_load(url) for url, _ in dp.replicas) and time.monotonic() < deadline:
        time.sleep(0.01)
    program("b")
    first.join()
    for name, calls in usage.items():
        for (prev_prompt, _), (_, cached) in zip(calls, calls[1:], strict=False):
            assert cached >= prev_prompt, (name, calls)
    served = sorted(_finished(url) - b for (url, _), b in zip(dp.replicas, before, strict=True))
    assert served == [turns, turns], served


def test_responses_continue_on_whichever_replica_the_gateway_picks(dp, server):
    """The replicas share one store of /v1/responses, so a continuation (previous_response_id)
    works wherever the gateway sends it: every stored response is found on both replicas, and
    each continuation is answered as one server answers it."""
    client, single = (openai.OpenAI(base_url=url + "/v1", api_key="none") for url in (dp.url, server.url))
    kw = dict(model=MODEL, temperature=0, max_output_tokens=8)
    for i in range(4):
        first = client.responses.create(input=f"Name planet number {i + 1}.", **kw)
        for url, _ in dp.replicas:
            assert httpx.get(f"{url}/v1/responses/{first.id}", timeout=30).json()["id"] == first.id
        then = client.responses.create(input="And the next one?", previous_response_id=first.id, **kw)
        alone = single.responses.create(input="And the next one?", **kw, previous_response_id=single.responses.create(
            input=f"Name planet number {i + 1}.", **kw).id)
        assert (then.output_text, then.usage.input_tokens) == (alone.output_text, alone.usage.input_tokens)


def test_a_background_response_streams_to_its_end_from_either_replica(dp):
    """A background response runs on one replica; streaming it from the other waits for the
    stored end and replays it, so both streams end with the same stored response."""
    client = openai.OpenAI(base_url=dp.url + "/v1", api_key="none")
    started = client.responses.create(model=MODEL, input="Name three planets.", max_output_tokens=24, temperature=0,
                                      background=True)
    ends = []
    for url, _ in dp.replicas:
        events = list(openai.OpenAI(base_url=url + "/v1", api_key="none").responses.retrieve(started.id, stream=True))
        ends.append(events[-1].response.model_dump())
    assert ends[0] == ends[1] and ends[0]["status"] in ("completed", "incomplete") and ends[0]["output"]


def _long_background_response(dp):
    """A background response that runs for a minute or more, and clients of the replica
    running it and of the other one."""
    started = openai.OpenAI(base_url=dp.url + "/v1", api_key="none").responses.create(
        model=MODEL, input="Count from 1 to 400, separated by commas.", max_output_tokens=1500, temperature=0,
        background=True)
    clients = [openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) for url, _ in dp.replicas]
    deadline = time.monotonic() + 30
    while not any(loads := [_load(url) for url, _ in dp.replicas]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    owner, other = clients if loads[0] else clients[::-1]  # the replica running its request
    return started, owner, other


def test_a_running_background_responses_progress_reaches_the_other_replica(dp):
    """The replica that runs a background response writes it to the shared store every few
    seconds: the other one shows its output so far (and that it is alive), refuses to delete
    it, and cancels it through the store (the running replica sees the mark)."""
    started, owner, other = _long_background_response(dp)
    deadline = time.monotonic() + 30
    with pytest.raises(openai.BadRequestError, match="still in progress"):
        other.responses.delete(started.id)
    while not (seen := other.responses.retrieve(started.id)).output:
        assert seen.status == "in_progress" and time.monotonic() < deadline, seen
        time.sleep(0.5)
    cancelled = other.responses.cancel(started.id)
    assert cancelled.status == "cancelled" and cancelled.output
    assert owner.responses.retrieve(started.id).status == "cancelled"
    assert owner.responses.cancel(started.id).status == "cancelled"  # again: the same answer
    while any(_load(url) for url, _ in dp.replicas):  # its request was aborted, not left running
        assert time.monotonic() < deadline + 30
        time.sleep(0.1)


def test_a_background_response_streamed_from_the_other_replica_shows_its_progress(dp):
    """Streamed from the replica that does not run it, a running background response's
    text arrives as the running replica writes it to the store, not only at its end."""
    started, owner, other = _long_background_response(dp)
    text = ""
    with other.responses.retrieve(started.id, stream=True) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                text += event.delta
                if len(text) > 20:
                    break
        assert owner.responses.retrieve(started.id).status == "in_progress"
        assert owner.responses.cancel(started.id).status == "cancelled"
        rest = list(stream)
    text += "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    assert text == owner.responses.retrieve(started.id).output[0].content[0].text
    assert rest[-1].type == "response.output_item.done" and rest[-1].item.status == "incomplete"


def test_a_request_without_model_is_for_the_served_model(dp):
    """The gateway fills in model "unknown" where a chat or a response names none."""
    chat = httpx.post(dp.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                             "max_tokens": 2}, timeout=60)
    assert chat.status_code == 200 and chat.json()["model"] == MODEL, chat.text
    response = httpx.post(dp.url + "/v1/responses", json={"input": "Hi", "max_output_tokens": 2}, timeout=60)
    assert response.status_code == 200 and response.json()["model"] == MODEL, response.text


def test_dsl_programs_through_the_gateway_run_without_pins(dp, server, caplog):
    """The gateway forwards neither /end_program nor program_id: the first program ends with
    one warning, later ones do not ask for pins, and no replica holds any. It refuses a batch
    of texts, which select() sends: after one warning they go one request each, and the
    choice is a single server's."""
    import frontend_lang as sgl

    @sgl.function
    def two_turns(s):
        s += sgl.user("Name a planet.") + sgl.assistant(sgl.gen("a", max_tokens=4, temperature=0))
        s += sgl.user("And a moon.") + sgl.assistant(sgl.gen("b", max_tokens=4, temperature=0))
        s += "The capital of France is" + sgl.select("city", [" Paris", " London", " Rome"])

    backend = sgl.RuntimeEndpoint(dp.url)
    with caplog.at_level("WARNING"):
        for _ in range(2):
            state = two_turns.run(backend=backend)
            assert state["b"]
    alone = two_turns.run(backend=sgl.RuntimeEndpoint(server.url))
    assert state["city"] == alone["city"]
    assert state.get_meta_info("city")["normalized_prompt_logprobs"] == pytest.approx(
        alone.get_meta_info("city")["normalized_prompt_logprobs"], abs=0.05)  # other thread counts: bf16 sums
    assert backend.pins_programs is False and backend.batches_texts is False
    # a gen with tools renders its chat on the server, at a route the gateway does not forward
    with pytest.raises(sgl.BackendError, match="run tool programs against a server's own URL"):
        backend.chat_prompt([{"role": "user", "content": "Hi"}], None)
    assert [r.getMessage() for r in caplog.records].count(
        f"{dp.url} refuses a batch of texts (a gateway in front of the servers?): a batch goes as one request per "
        "text from now on") == 1
    assert [r.getMessage() for r in caplog.records].count(
        f"{dp.url} has no /end_program (a gateway in front of the servers?): programs run on it without cache pins"
    ) == 1
    for url, _ in dp.replicas:
        assert httpx.get(url + "/get_server_info", timeout=30).json()["scheduler"]["num_pinned_programs"] == 0


def _healthy(dp) -> dict[str, bool]:
    workers = httpx.get(dp.url + "/workers", timeout=10).json()["workers"]
    return {w["url"]: w["is_healthy"] for w in workers}


def _largest_child(pid: int) -> int:
    """The child of ``pid`` that holds the most memory: a replica's scheduler (the model)."""
    def rss(child: int) -> int:
        with open(f"/proc/{child}/statm") as f:
            return int(f.read().split()[1])

    def parent(child: int) -> int:
        return int(Path(f"/proc/{child}/stat").read_text().rsplit(") ", 1)[1].split()[1])

    return max((p for p in descendants(pid) if parent(p) == pid), key=rss)


def test_a_replica_whose_scheduler_dies_leaves_the_gateway_before_its_requests_fail(dp):
    """The replica says so and waits a moment before failing its open requests: by then the
    launcher has taken it out of the gateway, which retries them on the other replica (they
    were retried on the dying one and failed, a 500 to the client). Then the replica exits."""
    dead_url, dead_pid = dp.replicas[0]
    scheduler = _largest_child(dead_pid)
    answers: list[httpx.Response] = []
    body = {"model": MODEL, "max_tokens": 48, "ignore_eos": True, "temperature": 0}

    def ask(i: int) -> None:
        answers.append(httpx.post(dp.url + "/v1/chat/completions", timeout=120, json={
            **body, "messages": [{"role": "user", "content": f"Question {i}: name {i + 2} colours."}]}))

    askers = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in askers:
        t.start()
    deadline = time.monotonic() + 60
    while httpx.get(dead_url + "/get_load", timeout=30).json()[0]["num_reqs"] == 0:  # some run on it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(scheduler, signal.SIGKILL)
    for t in askers:
        t.join()
    assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers if a.status_code != 200]
    deadline = time.monotonic() + 10
    while dead_url in _healthy(dp) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _healthy(dp) == {dp.replicas[1][0]: True}
    for i in range(3):
        assert _chat(dp.url, [{"role": "user", "content": f"Say {i}."}], stream=i == 1)
    output = dp.read_output()
    assert re.search(r"^forkserve: replica 0 \(\S+\) lost one of its processes and is stopping; taken out of the "
                     r"gateway; the other replicas keep serving", output, re.M), output[-3000:]
    deadline = time.monotonic() + 30
    while pid_alive(dead_pid):  # then it exits
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_sigterm_stops_every_process(dp):
    """...and a stream running at the time is answered to its end (an error event and
    ``[DONE]``, as from a single server), not cut off when the gateway stops; a request that
    is not streamed gets a 503 (the gateway retried the replica's 503 on a stopping replica,
    a 500 naming it, until the launcher took the replicas out of the gateway first)."""
    tree = descendants(dp.proc.pid)
    assert len(tree) >= 3, tree  # the gateway and the live replica with its scheduler and detokenizer
    lines: list[str] = []
    whole: list[httpx.Response] = []
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 2000,
            "ignore_eos": True}

    def stream() -> None:
        with httpx.stream("POST", dp.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as resp:
            lines.extend(line for line in resp.iter_lines() if line)

    readers = [threading.Thread(target=stream),
               threading.Thread(target=lambda: whole.append(httpx.post(dp.url + "/v1/chat/completions", json=body,
                                                                       timeout=60)))]
    for reader in readers:
        reader.start()
    time.sleep(2)
    assert dp.stop(signal.SIGTERM) == 0, dp.read_output()[-3000:]
    for reader in readers:
        reader.join(30)
    assert lines and lines[-1] == "data: [DONE]" and any("shutting down" in line for line in lines), lines[-3:]
    # The replica killed before was out of the gateway already: the other must still be taken out.
    assert "did not take the replicas out" not in dp.read_output()
    assert [r.status_code for r in whole] == [503], [r.text for r in whole]
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in tree if pid_alive(p)], "processes left behind after SIGTERM"
