"""SGLang's native API over plain HTTP against a real server: ``/generate`` (single, batch,
token ids, prefill-only, logprobs, SSE), introspection endpoints and client disconnects."""

from __future__ import annotations

import re
import time

import httpx
import orjson
import pytest

from tests.server_probes import ABORTED, metric, post_and_leave, wait_for_aborts

pytestmark = pytest.mark.slow

GREEDY = {"max_new_tokens": 20, "temperature": 0}
GREEDY_ONE = {"max_new_tokens": 2, "temperature": 0}


def post(server, path: str, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=timeout)


def sse_events(lines) -> list:
    events = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        payload = line[len("data: ") :]
        events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


def wait_idle(server, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        sched = server.info()["scheduler"]
        if sched["num_running_reqs"] == 0 and sched["num_waiting_reqs"] == 0:
            return sched
        assert time.monotonic() < deadline, f"server never went idle: {sched}"
        time.sleep(0.2)


def test_single_and_batch_text_equal_offline_engine(server, engine):
    prompts = ["The quick brown fox", "In 1492, Columbus", "import numpy as np\n"]
    single = post(server, "/generate", {"text": prompts[0], "sampling_params": GREEDY}).json()
    ref = engine.generate(prompts[0], GREEDY)
    assert single["text"] == ref["text"] and single["output_ids"] == ref["output_ids"]
    assert single["meta_info"]["prompt_tokens"] == ref["meta_info"]["prompt_tokens"]
    assert single["meta_info"]["finish_reason"] == ref["meta_info"]["finish_reason"]
    assert single["meta_info"]["e2e_latency"] > 0
    batch = post(server, "/generate", {"text": prompts, "sampling_params": GREEDY}).json()
    refs = engine.generate(prompts, GREEDY)
    assert [b["text"] for b in batch] == [r["text"] for r in refs]


def test_input_ids_and_per_prompt_params(server, engine):
    ids = [engine.tokenizer.encode("Roses are red,"), engine.tokenizer.encode("Water boils at")]
    params = [{"max_new_tokens": 5, "temperature": 0}, {"max_new_tokens": 9, "temperature": 0}]
    out = post(server, "/generate", {"input_ids": ids, "sampling_params": params}).json()
    refs = engine.generate(input_ids=ids, sampling_params=params)
    assert [o["output_ids"] for o in out] == [r["output_ids"] for r in refs]
    assert [o["meta_info"]["completion_tokens"] for o in out] == [5, 9]


def test_a_request_without_max_new_tokens_runs_to_the_context(server):
    """SGLang refuses only a max_new_tokens the client gave: left out near the context, the
    default (128) is cut to the room left."""
    resp = httpx.post(f"{server.url}/generate", json={"input_ids": [7] * 8190,
                      "sampling_params": {"ignore_eos": True}}, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.json()["meta_info"]["completion_tokens"] == 2


def test_prefill_only_then_reuse(server):
    text = "A long shared context about agents and their tools. " * 12
    first = post(server, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 0}}).json()
    assert first["text"] == "" and first["output_ids"] == []
    assert first["meta_info"]["completion_tokens"] == 0
    n = first["meta_info"]["prompt_tokens"]
    second = post(server, "/generate", {"text": text + "Next,", "sampling_params": GREEDY}).json()
    assert second["meta_info"]["cached_tokens"] >= n - 1


def test_cache_keys_do_not_share(server):
    text = "Tenant-private system prompt with many words in it. " * 6
    post(server, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 0}, "extra_key": "a"})
    other = post(server, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}, "extra_key": "b"})
    same = post(server, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}, "extra_key": "a"})
    assert other.json()["meta_info"]["cached_tokens"] == 0
    assert same.json()["meta_info"]["cached_tokens"] > 0
    # a gateway's extra_key beside each tenant's cache_salt: both count
    keys = [{"extra_key": "gw", "cache_salt": "alice"}, {"extra_key": "gw", "cache_salt": "bob"},
            {"cache_salt": "gw"}, {"extra_key": "gw", "cache_salt": "alice"}]
    cached = [post(server, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}, **k}).json()
              ["meta_info"]["cached_tokens"] for k in keys]
    assert cached[:3] == [0, 0, 0] and cached[3] > 0


def test_logprobs_equal_offline_engine(server, engine):
    body = {
        "text": "Paris is the capital of",
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    got = post(server, "/generate", body).json()["meta_info"]
    ref = engine.generate(
        body["text"], body["sampling_params"], return_logprob=True, logprob_start_len=0, top_logprobs_num=2,
        return_text_in_logprobs=True,
    )["meta_info"]
    for key in ("input_token_logprobs", "output_token_logprobs"):
        assert len(got[key]) == len(ref[key])
        for (glp, gid, gtext), (rlp, rid, rtext) in zip(got[key], ref[key], strict=True):
            assert (gid, gtext) == (rid, rtext)
            assert (glp is None and rlp is None) or glp == pytest.approx(rlp, abs=1e-4)
    assert got["input_token_logprobs"][0][0] is None
    assert [[t[1] for t in top] for top in got["output_top_logprobs"]] == [
        [t[1] for t in top] for top in ref["output_top_logprobs"]
    ]


@pytest.mark.parametrize("start", [0, 150])
def test_n_samples_report_their_prompts_logprobs_computed_once(server, engine, start):
    """n samples of a prompt each report its logprobs, as one request alone does (and the
    offline engine); only the first computes them: the others reuse its cached prompt (they
    computed them n times, each without the cache)."""
    text = "The history of the city goes back many centuries. " * 20
    body = {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 1.0, "n": 3},
            "return_logprob": True, "logprob_start_len": start, "top_logprobs_num": 2, "extra_key": f"n-{start}"}
    outs = post(server, "/generate", body).json()
    alone = post(server, "/generate", {**body, "sampling_params": {"max_new_tokens": 1}}).json()["meta_info"]
    ref = engine.generate(text, {"max_new_tokens": 2, "temperature": 1.0, "n": 3}, return_logprob=True,
                          logprob_start_len=start, top_logprobs_num=2, namespace=f"n-{start}")
    assert [o["meta_info"]["cached_tokens"] > 0 for o in outs] == [False, True, True]
    assert [r["meta_info"]["cached_tokens"] > 0 for r in ref] == [False, True, True]
    # with ids of its own the client may abort one sample (/abort_request "s_0"): each scores its own,
    # or the others would lose the prompt's logprobs with the first
    own = post(server, "/generate", {**body, "rid": "s", "extra_key": f"own-{start}"}).json()
    assert all(o["meta_info"]["cached_tokens"] <= start for o in own)  # the scored part computed by each
    outs += own
    for meta in [o["meta_info"] for o in outs] + [r["meta_info"] for r in ref]:
        assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] - start
        for got, want in zip(meta["input_token_logprobs"], alone["input_token_logprobs"], strict=True):
            assert got[1] == want[1] and (got[0] is None) == (want[0] is None)
            assert got[0] is None or got[0] == pytest.approx(want[0], abs=1e-4)
        assert [[t[1] for t in top] for top in meta["input_top_logprobs"][1:]] == \
               [[t[1] for t in top] for top in alone["input_top_logprobs"][1:]]


def test_stream_is_cumulative_and_ends_with_done(server, engine):
    body = {"text": "Here is a short poem:", "sampling_params": {"max_new_tokens": 24, "temperature": 0}, "stream": True}
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=120) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))  # cumulative
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    ref = engine.generate(body["text"], body["sampling_params"])
    assert chunks[-1]["text"] == ref["text"]
    assert chunks[-1]["output_ids"] == ref["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == ref["meta_info"]["finish_reason"]


def test_streamed_logprobs_come_once_per_token(server):
    body = {"text": "Here is a short poem:", "sampling_params": {"max_new_tokens": 12, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2}
    whole = post(server, "/generate", body).json()["meta_info"]
    with httpx.stream("POST", server.url + "/generate", json={**body, "stream": True}, timeout=120) as resp:
        events = [e["meta_info"] for e in sse_events(resp.iter_lines())[:-1]]
    assert sum((e["output_token_logprobs"] for e in events), []) == whole["output_token_logprobs"]
    assert sum((e["output_top_logprobs"] for e in events), []) == whole["output_top_logprobs"]
    assert events[0]["input_token_logprobs"] == whole["input_token_logprobs"]
    assert all(e["input_token_logprobs"] == [] for e in events[1:])
    # SGLang's count of the output's logprobs so far, which its frontend's streaming reads
    assert all(e["output_token_logprobs_length"] == e["completion_tokens"] for e in events)
    assert whole["output_token_logprobs_length"] == whole["completion_tokens"] == 12


def test_stream_with_stop_regex_never_shows_the_match(server, engine):
    params = {"max_new_tokens": 24, "temperature": 0}
    free = engine.generate("Here is a short poem:", params)["text"]
    word = max(re.findall(r"[a-z]{4,}", free[len(free) // 3 :]), key=len)  # a word late in the answer
    pattern = re.escape(word[:2]) + r"[a-z]*" + re.escape(word[-1])
    body = {"text": "Here is a short poem:", "sampling_params": {**params, "stop_regex": pattern}, "stream": True}
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=120) as resp:
        chunks = sse_events(resp.iter_lines())[:-1]
    assert all(not re.search(pattern, c["text"]) for c in chunks)
    ref = engine.generate(body["text"], body["sampling_params"])
    assert ref["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert chunks[-1]["text"] == ref["text"] == free[: re.search(pattern, free).start()]


def test_n_expands_into_a_batch(server):
    out = post(server, "/generate", {"text": "Tell me a joke.", "sampling_params": {**GREEDY, "n": 2}}).json()
    assert isinstance(out, list) and len(out) == 2 and out[0]["text"] == out[1]["text"]


def test_rids_per_prompt_expand_for_n_as_sglang_does(server):
    """A rid list has one id per prompt (SGLang's rule; ``n > 1`` runs each as rid_0, rid_1)
    or one per request; other lengths are a 400."""
    body = {"text": ["A", "B"], "sampling_params": {"max_new_tokens": 1, "n": 2}}
    out = post(server, "/generate", {**body, "rid": ["ra", "rb"]}).json()
    assert [o["meta_info"]["id"] for o in out] == ["ra_0", "ra_1", "rb_0", "rb_1"]
    out = post(server, "/generate", {**body, "rid": ["w", "x", "y", "z"]}).json()
    assert [o["meta_info"]["id"] for o in out] == ["w", "x", "y", "z"]
    one = post(server, "/generate", {"text": "A", "rid": ["solo"], "sampling_params": {"max_new_tokens": 1, "n": 2}})
    assert [o["meta_info"]["id"] for o in one.json()] == ["solo_0", "solo_1"]
    bad = post(server, "/generate", {**body, "rid": ["a", "b", "c"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "rid"


def test_a_batch_larger_than_a_send_chunk_answers_each_prompt_in_order(server):
    """Past 512 requests a batch reaches the scheduler in chunks (``Outbox``), past 1,000 its
    answer is rendered on a thread: same outputs as each prompt alone, in order."""
    texts = ["The sky is", "One, two,", "Paris is the capital of"]
    alone = [post(server, "/generate", {"text": t, "sampling_params": GREEDY_ONE}).json()["text"] for t in texts]
    out = post(server, "/generate", {"text": texts * 401, "sampling_params": GREEDY_ONE}).json()
    assert len(out) == 1203 and [o["text"] for o in out] == alone * 401


def test_repeated_rids_are_a_400_that_names_the_repeats_only(server):
    """The message listed every rid of the batch (100k of them for a batch that size)."""
    rids = [f"r{k}" for k in range(300)] + ["r7", "r9"]
    bad = post(server, "/generate", {"text": ["A"] * len(rids), "rid": rids, "sampling_params": {"max_new_tokens": 1}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "rid"
    message = bad.json()["error"]["message"]
    assert "'r7', 'r9'" in message and "'r8'" not in message and len(message) < 200


def test_logprob_options_per_prompt(server):
    """``return_logprob``, ``logprob_start_len`` and ``top_logprobs_num`` as lists of one value
    per prompt (SGLang's): each prompt's answer is the one it gets asked alone."""
    texts = ["Paris is the capital of", "One, two, three,"]
    per_prompt = {"return_logprob": [True, False], "logprob_start_len": [2, -1], "top_logprobs_num": [3, 0]}
    both = post(server, "/generate", {"text": texts, "sampling_params": GREEDY, **per_prompt}).json()
    for i, text in enumerate(texts):
        alone = post(server, "/generate", {"text": text, "sampling_params": GREEDY,
                                           **{k: v[i] for k, v in per_prompt.items()}}).json()
        assert both[i]["output_ids"] == alone["output_ids"]
        for key in ("input_token_logprobs", "output_token_logprobs", "output_top_logprobs"):
            assert (key in both[i]["meta_info"]) == (key in alone["meta_info"]) == (i == 0)
            if i == 0:
                got, want = both[i]["meta_info"][key], alone["meta_info"][key]
                assert [[e[1:] for e in x] if key == "output_top_logprobs" else x[1:] for x in got] == \
                       [[e[1:] for e in x] if key == "output_top_logprobs" else x[1:] for x in want]
    assert len(both[0]["meta_info"]["input_token_logprobs"]) == both[0]["meta_info"]["prompt_tokens"] - 2
    assert all(len(top) == 3 for top in both[0]["meta_info"]["output_top_logprobs"])
    wrong = post(server, "/generate", {"text": texts, "sampling_params": GREEDY, "top_logprobs_num": [1]})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "top_logprobs_num"


def test_info_endpoints(server):
    assert httpx.get(server.url + "/health").status_code == 200
    info = httpx.get(server.url + "/get_model_info").json()
    assert info["is_generation"] is True and info["model_path"]
    sched = wait_idle(server)
    assert sched["kv_capacity"] == 40_000 - 1 or sched["kv_capacity"] > 0
    assert sched["kv_invariant_holds"] is True
    assert httpx.post(server.url + "/flush_cache").status_code == 200
    assert wait_idle(server)["kv_evictable"] == 0


def test_metrics_count_tokens_and_latency(server):
    before = metric(server, "forkserve:generation_tokens_total")
    post(server, "/generate", {"text": "Metrics test", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    text = httpx.get(server.url + "/metrics").text
    assert metric(server, "forkserve:generation_tokens_total") == before + 3
    for name in ("prompt_tokens_total", "cached_tokens_total", "cache_hit_rate", "num_running_reqs",
                 "num_waiting_reqs", "kv_usage", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_count", "prefill_steps_total", "prefill_computed_tokens_total",
                 "prefill_seconds_total", "decode_steps_total", "decode_seconds_total", "scheduler_seconds_total"):
        assert f"forkserve:{name}" in text, name


def test_stream_disconnect_frees_slots(server):
    aborted = metric(server, ABORTED)
    body = {"text": "Write a very long story.", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}, "stream": True}
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=120) as resp:
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few tokens in
    assert any(line.startswith("data: ") for line in got)
    sched = wait_idle(server)
    assert sched["kv_held_by_requests"] == 0 and sched["kv_protected"] == 0
    assert sched["kv_invariant_holds"] is True
    assert metric(server, ABORTED) == aborted + 1


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "A long story, please.", "stream": True,
                   "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}),
    ("/v1/chat/completions", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "A long story, please."}], "stream": True,
                              "max_tokens": 3000, "ignore_eos": True}),
    ("/v1/responses", {"model": "SmolLM2-135M-Instruct", "input": "A long story, please.", "stream": True, "max_output_tokens": 3000,
                       "ignore_eos": True, "store": False}),
])
def test_stream_whose_client_left_before_it_began_is_aborted(server, path, body):
    """The client sends a streamed request and closes the connection before reading a byte:
    its request is aborted, not run to max_new_tokens holding its KV slots. (Starlette starts
    the events generator even then and cancels it at its first wait, so the generator's own
    cleanup aborts the request.)"""
    aborted = metric(server, ABORTED)
    post_and_leave(server, path, body)
    wait_for_aborts(server, aborted)  # once the server has read and submitted the request
    sched = wait_idle(server)
    assert sched["kv_held_by_requests"] == 0 and sched["kv_invariant_holds"] is True


def test_abort_request_ends_a_request_by_its_rid_or_all_of_them(server):
    """SGLang's ``POST /abort_request``: the aborted request ends at the scheduler's next
    step with an ``abort`` finish reason and what it generated so far, as SGLang answers
    (a client keeps a partial sample); ``abort_all`` ends every one."""
    import concurrent.futures

    long = {"max_new_tokens": 3000, "ignore_eos": True}

    def generate(rid: str) -> dict:
        return post(server, "/generate", {"text": "A long story.", "rid": rid, "sampling_params": long}).json()

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        one = pool.submit(generate, "abort-me")
        wait_for_running(server, 1)
        wait_for_steps(server, 3)  # a few tokens
        assert post(server, "/abort_request", {"rid": "abort-me"}).status_code == 200
        out = one.result(timeout=30)
        meta = out["meta_info"]
        assert meta["finish_reason"] == {"type": "abort", "message": "aborted by /abort_request"}
        assert meta["id"] == "abort-me" and meta["completion_tokens"] == len(out["output_ids"]) > 0
        detokenized = post(server, "/detokenize", {"tokens": out["output_ids"]}).json()
        assert out["text"] == detokenized["text"] != ""
        assert post(server, "/abort_request", {"rid": "no-such-request"}).status_code == 200
        both = [pool.submit(generate, f"all-{i}") for i in range(2)]
        wait_for_running(server, 2)
        assert post(server, "/abort_request", {"abort_all": True}).status_code == 200
        assert [f.result(timeout=30)["meta_info"]["finish_reason"]["type"] for f in both] == ["abort", "abort"]
        # a batch under one rid runs as rid_0, rid_1: the rid aborts all of it
        batch = pool.submit(lambda: post(server, "/generate", {"text": ["A long story.", "Another one."], "rid": "batch",
                                                               "sampling_params": long}).json())
        wait_for_running(server, 2)
        assert post(server, "/abort_request", {"rid": "batch"}).status_code == 200
        assert [o["meta_info"]["finish_reason"]["type"] for o in batch.result(timeout=30)] == ["abort", "abort"]
    sched = wait_idle(server)
    assert sched["kv_held_by_requests"] == 0 and sched["kv_invariant_holds"] is True


def test_abort_request_ends_only_the_rid_and_what_was_expanded_from_it(server):
    """A client's own rid that begins with another's plus "_" (``job_2`` beside ``job``) is not
    one of ``job``'s expansions (``job_0``, ``job_1`` of a batch): aborting ``job`` leaves it."""
    import concurrent.futures

    long = {"max_new_tokens": 3000, "ignore_eos": True}

    def generate(rid: str | None, text: str | list[str] = "A long story.") -> dict:
        return post(server, "/generate", {"text": text, "rid": rid, "sampling_params": long}).json()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        job, other = pool.submit(generate, "job"), pool.submit(generate, "job_2")
        wait_for_running(server, 2)
        assert post(server, "/abort_request", {"rid": "job"}).status_code == 200
        assert job.result(timeout=30)["meta_info"]["finish_reason"]["type"] == "abort"
        wait_for_steps(server, 2)
        assert not other.done() and server.info()["scheduler"]["num_running_reqs"] == 1
        assert post(server, "/abort_request", {"rid": "job_2"}).status_code == 200
        assert other.result(timeout=30)["meta_info"]["finish_reason"]["type"] == "abort"
    wait_idle(server)


def test_an_abort_that_comes_while_the_request_is_still_arriving_ends_it(server):
    """``/abort_request`` for a request whose body the server is still reading (or whose
    prompt it is still tokenizing), so that it is not yet submitted: it is ended as soon as it
    is, not run to the end. A request sent after the abort with the same rid runs."""
    import socket

    body = orjson.dumps({"text": "A long story.", "rid": "late-abort", "stream": False,
                         "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}})
    url = httpx.URL(server.url)
    with socket.create_connection((url.host, url.port)) as sock:
        sock.sendall(f"POST /generate HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
        time.sleep(1.0)  # the server has begun to read the body
        assert post(server, "/abort_request", {"rid": "late-abort"}).status_code == 200
        sock.sendall(body[10:])
        sock.settimeout(60)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _content_length(answer):
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection"
            answer += chunk
    out = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert out["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted by /abort_request"}
    assert out["meta_info"]["completion_tokens"] < 400
    again = post(server, "/generate", {"text": "Hi", "rid": "late-abort", "sampling_params": {"max_new_tokens": 2}})
    assert again.json()["meta_info"]["finish_reason"]["type"] == "length"
    wait_idle(server)


def test_a_client_that_leaves_while_sending_its_body_is_no_server_error(server):
    """Headers that promise 1,000 bytes, 9 of them, then the connection closes: nothing to
    answer, nothing for the log to hold a traceback of, and the server serves on."""
    import socket

    url = httpx.URL(server.url)
    before = server.read_output().count("unexpected error")
    for path in ("/generate", "/v1/chat/completions"):
        with socket.create_connection((url.host, url.port)) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
                         "Content-Length: 1000\r\n\r\n{\"text\": ".encode())
            time.sleep(0.3)
    time.sleep(0.5)
    assert post(server, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    assert server.read_output().count("unexpected error") == before, server.output[-3000:]


def _content_length(response: bytes) -> int:
    head = response.split(b"\r\n\r\n", 1)[0].decode().lower()
    return int(re.search(r"content-length: (\d+)", head).group(1))


def test_abort_request_finds_openai_requests_by_their_rid(server):
    """SGLang's ``rid`` on the OpenAI routes names the requests, so ``/abort_request`` ends
    them: the answer so far, finish reason ``abort``; ``n > 1`` runs as rid_0, rid_1."""
    import concurrent.futures

    model = "SmolLM2-135M-Instruct"
    chat = {"model": model, "messages": [{"role": "user", "content": "A long story."}], "max_tokens": 3000,
            "ignore_eos": True, "rid": "chat-1", "n": 2}
    completion = {"model": model, "prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "rid": "cmpl-1"}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for path, body, running in (("/v1/chat/completions", chat, 2), ("/v1/completions", completion, 1)):
            answer = pool.submit(post, server, path, body)
            wait_for_running(server, running)
            wait_for_steps(server, 3)
            assert post(server, "/abort_request", {"rid": body["rid"]}).status_code == 200
            out = answer.result(timeout=30).json()
            assert [c["finish_reason"] for c in out["choices"]] == ["abort"] * running
            assert 0 < out["usage"]["completion_tokens"] < 3000 * running
    wait_idle(server)


def wait_for_steps(server, n: int, timeout: float = 30.0) -> None:
    """Until the engine has run ``n`` more forward steps (the running requests have tokens)."""
    start = server.info()["scheduler"]["num_forward_steps"]
    deadline = time.monotonic() + timeout
    while server.info()["scheduler"]["num_forward_steps"] < start + n:
        assert time.monotonic() < deadline, "the engine made no steps"
        time.sleep(0.02)


def wait_for_running(server, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while server.info()["scheduler"]["num_running_reqs"] < n:
        assert time.monotonic() < deadline, "the requests never started"
        time.sleep(0.05)


def test_non_stream_disconnect_frees_slots(server):
    body = {"text": "Another long story.", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with pytest.raises(httpx.ReadTimeout):
        post(server, "/generate", body, timeout=1.5)
    sched = wait_idle(server)
    assert sched["kv_held_by_requests"] == 0 and sched["kv_invariant_holds"] is True
