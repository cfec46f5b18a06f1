"""SGLang's native API over plain HTTP against a real server: ``/generate`` (single, batch,
token ids, prefill-only, logprobs, SSE) and introspection endpoints (aborts and client
disconnects: test_server_native_aborts.py)."""

from __future__ import annotations

import re

import httpx
import orjson
import pytest

from tests.server_probes import metric, post, wait_idle

pytestmark = pytest.mark.slow

GREEDY = {"max_new_tokens": 20, "temperature": 0}
GREEDY_ONE = {"max_new_tokens": 2, "temperature": 0}


def sse_events(lines) -> list:
    events = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        payload = line[len("data: ") :]
        events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


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


def test_a_request_without_max_new_tokens_runs_to_the_context(small_server):
    """SGLang refuses only a max_new_tokens the client gave: left out near the context, the
    default (128) is cut to the room left (the context is 64 tokens here)."""
    resp = httpx.post(f"{small_server.url}/generate", json={"input_ids": [7] * 62,
                      "sampling_params": {"ignore_eos": True}}, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.json()["meta_info"]["completion_tokens"] == 2
    given = httpx.post(f"{small_server.url}/generate", json={"input_ids": [7] * 62,
                       "sampling_params": {"ignore_eos": True, "max_new_tokens": 3}}, timeout=120)
    assert given.status_code == 400 and "max_new_tokens" in given.text, given.text


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



def test_health_probes_are_in_no_metric(server):
    """A gateway probing /health_generate every few seconds adds no requests of its own."""
    names = ("requests_total", "requests_finished_total", "prompt_tokens_total", "generation_tokens_total")
    before = [metric(server, f"forkserve:{name}") for name in names]
    for _ in range(3):
        assert httpx.get(server.url + "/health_generate", timeout=60).status_code == 200
    assert [metric(server, f"forkserve:{name}") for name in names] == before
