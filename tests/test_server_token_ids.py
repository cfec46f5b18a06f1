"""Token ids in the OpenAI routes' answers, as RL and agent-training loops ask vLLM for them
(``return_token_ids``, ``return_tokens_as_token_ids``, ``request_id``) and SGLang
(``input_ids``, ``return_prompt_token_ids``, ``return_meta_info``, ``sglext`` ids,
``/generate``'s ``return_prompt_token_ids``), checked against HF's own tokenization of the
chat and the offline ``Engine``'s greedy output; and the fields of both servers that are
accepted only at their neutral value."""

from __future__ import annotations

import json
import shutil
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "Name a planet."}]


def hf_chat_ids(hf_tokenizer, messages: list[dict]) -> list[int]:
    """The chat's prompt as HF tokenizes it (the template's text, no special tokens added)."""
    ids = hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def greedy_ids(engine, prompt_ids: list[int], n: int) -> list[int]:
    return engine.generate(input_ids=prompt_ids, sampling_params={"max_new_tokens": n, "temperature": 0})["output_ids"]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=120)


def sse_events(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={"model": MODEL, **body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_chat_answers_carry_vllm_and_sglang_token_ids(server, engine):
    prompt_ids = hf_chat_ids(engine.tokenizer.hf, MESSAGES)
    expected = greedy_ids(engine, prompt_ids, 12)
    body = post(server, "/v1/chat/completions", {
        "messages": MESSAGES, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "logprobs": True,
        "return_token_ids": True, "return_meta_info": True, "return_input_ids_in_sglext": True,
        "return_output_ids_in_sglext": True, "return_prompt_text": True,
    }).json()
    choice = body["choices"][0]
    assert body["prompt_token_ids"] == choice["prompt_token_ids"] == prompt_ids  # vLLM's place, SGLang's
    assert choice["token_ids"] == choice["response_token_ids"] == expected
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    meta = choice["meta_info"]  # /generate's
    assert meta["completion_tokens"] == 12 and [t[1] for t in meta["output_token_logprobs"]] == expected
    assert body["sglext"]["input_ids"] == prompt_ids and body["sglext"]["output_ids"] == [expected]
    assert engine.tokenizer.hf.encode(body["prompt_text"], add_special_tokens=False) == prompt_ids

    events = sse_events(server, "/v1/chat/completions", {
        "messages": MESSAGES, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
        "return_output_ids_in_sglext": True})
    assert events[0]["prompt_token_ids"] == prompt_ids  # with the role chunk, as vLLM sends it
    assert [t for e in events for c in e["choices"] for t in c.get("token_ids", [])] == expected
    assert events[-1]["choices"] == [] and events[-1]["sglext"]["output_ids"] == [expected]
    for name in ("return_meta_info", "return_prompt_token_ids"):  # SGLang's rule: whole answers only
        r = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "stream": True, name: True})
        assert r.status_code == 400 and r.json()["error"]["param"] == name


def test_streamed_ids_held_back_with_text_go_with_the_next_chunk(server, engine):
    """A stop string's possible start is held back (no chunk), its tokens' ids must come with
    a later chunk: all of them, once, in order, as the whole answer has them."""
    body = {"messages": MESSAGES, "max_tokens": 24, "temperature": 0, "return_token_ids": True,
            "stop": ["zzz never", " the"]}
    whole = post(server, "/v1/chat/completions", body).json()["choices"][0]
    events = sse_events(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    streamed = [t for e in events for c in e["choices"] for t in c.get("token_ids", [])]
    assert streamed == whole["token_ids"] and streamed
    assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"]) == whole["message"]["content"]
    assert events[-1]["usage"]["completion_tokens"] == len(streamed)


@pytest.mark.parametrize("where", ["body", "header"])
def test_a_request_id_can_be_aborted(server, where):
    """vLLM's request_id (in the body, or its X-Request-Id header) is the request's id here:
    SGLang's /abort_request ends it by it, and the answer's id carries it."""
    import threading

    out: dict = {}
    body = {"prompt": "Count: 1, 2,", "max_tokens": 2000, "ignore_eos": True}

    def run() -> None:
        if where == "body":
            out["body"] = post(server, "/v1/completions", {**body, "request_id": "abort-me"}).json()
        else:
            out["body"] = httpx.post(server.url + "/v1/completions", json=body, headers={"X-Request-Id": "abort-me"},
                                     timeout=120).json()

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 60
    while worker.is_alive() and time.monotonic() < deadline:  # an abort before it arrives is kept for it
        assert httpx.post(server.url + "/abort_request", json={"rid": "abort-me"}, timeout=10).status_code == 200
        worker.join(0.5)
    assert out["body"]["choices"][0]["finish_reason"] == "abort", out["body"]
    assert out["body"]["id"] == "cmpl-abort-me"


def test_chat_input_ids_are_the_prompt(server, engine):
    other = [{"role": "user", "content": "What is 2 + 2?"}]
    other_ids = hf_chat_ids(engine.tokenizer.hf, other)
    given = post(server, "/v1/chat/completions", {
        "messages": MESSAGES, "input_ids": other_ids, "max_tokens": 10, "temperature": 0,
        "return_prompt_token_ids": True}).json()
    asked = post(server, "/v1/chat/completions", {"messages": other, "max_tokens": 10, "temperature": 0}).json()
    assert given["choices"][0]["message"]["content"] == asked["choices"][0]["message"]["content"]
    assert given["choices"][0]["prompt_token_ids"] == other_ids
    for bad in ([10**7], [-1], []):
        r = post(server, "/v1/chat/completions", {"messages": MESSAGES, "input_ids": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input_ids", r.text


def test_completions_token_ids_and_tokens_named_by_id(server, engine):
    prompt = "The capital of France is"
    prompt_ids = engine.tokenizer.hf.encode(prompt)
    expected = greedy_ids(engine, prompt_ids, 8)
    body = post(server, "/v1/completions", {
        "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 2, "echo": True,
        "return_token_ids": True, "return_tokens_as_token_ids": True}).json()
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == prompt_ids and choice["token_ids"] == expected
    assert choice["text"].startswith(prompt)  # echo keeps the prompt in the text (vLLM's drops it)
    named = choice["logprobs"]["tokens"]
    assert named == [f"token_id:{t}" for t in prompt_ids + expected]
    assert all(k.startswith("token_id:") for top in choice["logprobs"]["top_logprobs"][1:] for k in top)

    events = sse_events(server, "/v1/completions", {
        "prompt": [prompt, "List three colors:"], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True})
    for index, ids in enumerate([prompt_ids, engine.tokenizer.hf.encode("List three colors:")]):
        mine = [c for e in events for c in e["choices"] if c["index"] == index]
        assert mine[0]["prompt_token_ids"] == ids and all("prompt_token_ids" not in c for c in mine[1:])
        assert [t for c in mine for t in c["token_ids"]] == greedy_ids(engine, ids, 8)


def test_chat_logprobs_name_tokens_by_id(server, engine):
    body = post(server, "/v1/chat/completions", {
        "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2,
        "return_tokens_as_token_ids": True, "return_token_ids": True}).json()
    choice = body["choices"][0]
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert [bytes(c["bytes"]) for c in content] == [engine.tokenizer.token_bytes.of(t) for t in choice["token_ids"]]
    assert all(top["token"].startswith("token_id:") for c in content for top in c["top_logprobs"])


def test_request_id_is_the_rid_and_the_answer_id(server):
    body = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "request_id": "job-7"}).json()
    assert body["id"] == "chatcmpl-job-7"
    body = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "request_id": "job-8"}).json()
    assert body["id"] == "cmpl-job-8"
    for ids in ({"request_id": "a", "rid": "b"}, {"request_id": ""}):
        r = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, **ids})
        assert r.status_code == 400 and r.json()["error"]["param"] == "request_id"


def test_generate_returns_prompt_token_ids_in_every_output(server, engine):
    ids = engine.tokenizer.hf.encode("Once upon a time")
    body = httpx.post(server.url + "/generate", json={
        "text": "Once upon a time", "sampling_params": {"max_new_tokens": 3}, "return_prompt_token_ids": True},
        timeout=60).json()
    assert body["prompt_token_ids"] == ids
    with httpx.stream("POST", server.url + "/generate", json={
            "input_ids": [ids, ids[:2]], "sampling_params": {"max_new_tokens": 3}, "stream": True,
            "return_prompt_token_ids": True}, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events and all(e["prompt_token_ids"] == [ids, ids[:2]][e["index"]] for e in events)


def test_cached_tokens_details_come_in_sglext(server):
    body = {"messages": [{"role": "user", "content": "Tell me about the sea, briefly."}], "max_tokens": 2,
            "return_cached_tokens_details": True}
    post(server, "/v1/chat/completions", body)
    again = post(server, "/v1/chat/completions", body).json()
    details = again["sglext"]["cached_tokens_details"]
    assert details["device"] == again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


@pytest.mark.parametrize(("path", "field", "value"), [
    ("/v1/chat/completions", "thinking_token_budget", 64),
    ("/v1/chat/completions", "thinking", {"type": "enabled"}),
    ("/v1/chat/completions", "echo", True),
    ("/v1/chat/completions", "watermark", {"enabled": True}),
    ("/v1/chat/completions", "routed_dp_rank", 1),
    ("/v1/completions", "prompt_embeds", "AAAA"),
    ("/v1/completions", "repetition_detection", {"max_pattern_size": 4}),
    ("/generate", "max_thinking_tokens", 16),
    ("/generate", "modalities", ["image"]),
])
def test_fields_the_server_cannot_honour_are_400s_naming_them(server, path, field, value):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}} if path == "/generate" else (
        {"messages": MESSAGES, "max_tokens": 1} if "chat" in path else {"prompt": "Hi", "max_tokens": 1})
    r = post(server, path, {**body, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


@pytest.mark.parametrize(("path", "fields"), [
    ("/v1/chat/completions", {"thinking_token_budget": -1, "session_id": "s1", "stream_interval": 4,
                              "custom_labels": {"team": "a"}, "length_penalty": 1.0, "mm_payload": "tensors",
                              "return_flat_raw_top_logprobs_b64": True, "routed_dp_rank": 0}),
    ("/generate", {"session_id": "s1", "routing_key": "k", "conversation_id": "c", "received_time": 1.0,
                   "custom_labels": {"team": "a"}}),
])
def test_hints_and_neutral_values_are_accepted(server, path, fields):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}} if path == "/generate" else {
        "messages": MESSAGES, "max_tokens": 1}
    r = post(server, path, {**body, **fields})
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def bos_model(tiny_gqa_llama, tmp_path_factory):
    """The tiny model with a tokenizer that adds a BOS and a chat template that writes one
    (as Llama 3's both do)."""
    folder = tmp_path_factory.mktemp("bos_model") / "m"
    shutil.copytree(tiny_gqa_llama, folder)
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(bos_token="<|endoftext|>", chat_template="{{ bos_token }}" + config["chat_template"])
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_chat_gets_the_templates_bos_only(bos_model):
    from transformers import AutoTokenizer

    from runtime.server.server_process import ServerProcess

    hf = AutoTokenizer.from_pretrained(bos_model)
    assert hf.encode("Hi")[0] == 0  # the tokenizer adds a BOS to text
    expected = hf_chat_ids(hf, MESSAGES)
    assert expected[0] == 0 and expected[1] != 0  # the template's own, once
    proc = ServerProcess("--model-path", str(bos_model), "--max-total-tokens", "2048").wait_ready()
    try:
        def call(path: str, body: dict) -> dict:
            r = httpx.post(proc.url + path, json={"model": "m", **body}, timeout=60)  # the folder's name
            assert r.status_code == 200, r.text
            return r.json()

        chat = call("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True})
        assert chat["prompt_token_ids"] == expected
        assert call("/tokenize", {"messages": MESSAGES})["tokens"] == expected  # the chat route's count
        asked = call("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True,
                                              "add_special_tokens": True})
        assert asked["prompt_token_ids"] == expected  # vLLM's add_special_tokens: the template wrote the BOS already
        text = call("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "return_token_ids": True})
        assert text["choices"][0]["prompt_token_ids"] == hf.encode("Hi")  # a text prompt gets it
        bare = call("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "return_token_ids": True,
                                        "add_special_tokens": False})
        assert bare["choices"][0]["prompt_token_ids"] == hf.encode("Hi", add_special_tokens=False)
        # a text that starts with the BOS (a rendered template, as the DSL sends it) gets no second one
        rendered = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        assert hf.encode(rendered)[:2] == [0, 0]  # what the tokenizer alone would do
        native = call("/generate", {"text": rendered, "sampling_params": {"max_new_tokens": 1},
                                    "return_prompt_token_ids": True})
        assert native["prompt_token_ids"] == expected
    finally:
        assert proc.stop() == 0


def test_a_prompt_of_ids_cut_inside_a_character_gets_it_back_whole(server, engine):
    """The output's first token completes the prompt's last character: the text has it
    whole, streamed or not, in /v1/completions and /generate (it showed as U+FFFD)."""
    ids = engine.tokenizer.hf.encode("日本語の文章。日本", add_special_tokens=False)[:-2]
    head = engine.tokenizer.decode(ids)
    assert head.endswith("\ufffd")
    out = greedy_ids(engine, ids, 6)
    want = engine.tokenizer.decode(ids + out)[len(head) - 1 :]
    assert "\ufffd" not in want
    body = {"prompt": ids, "max_tokens": 6, "temperature": 0}
    assert post(server, "/v1/completions", body).json()["choices"][0]["text"] == want
    echoed = post(server, "/v1/completions", {**body, "echo": True}).json()["choices"][0]["text"]
    assert echoed == engine.tokenizer.decode(ids + out), "echo: the prompt's text and the output's, the character once"
    streamed = "".join(e["choices"][0]["text"] for e in sse_events(server, "/v1/completions", body) if e["choices"])
    assert streamed == want
    native = httpx.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 6,
                                                                                                "temperature": 0}},
                        timeout=120)
    assert native.json()["text"] == want


def test_an_answer_cut_inside_a_character_ends_before_it(server):
    """max_tokens ends the answer on a character's first bytes: the text leaves it out
    (vLLM's rule), streamed or not; resent as the prompt, the next answer has it whole."""
    body = {"prompt": "Say it:", "max_tokens": 1, "temperature": 0, "regex": "日本"}
    whole = post(server, "/v1/completions", body).json()["choices"][0]
    assert whole["finish_reason"] == "length" and whole["text"] == ""
    streamed = "".join(e["choices"][0]["text"] for e in sse_events(server, "/v1/completions", body) if e["choices"])
    assert streamed == ""
    native = httpx.post(server.url + "/generate", json={"text": "Say it:", "sampling_params": {
        "max_new_tokens": 1, "temperature": 0, "regex": "日本"}}, timeout=120).json()
    assert native["text"] == ""


def test_parallel_calls_with_one_x_request_id_both_run(server):
    """A trace id sent as X-Request-Id with parallel calls names each answer; the second is
    not refused for an id in use (its request gets one of the server's)."""
    import concurrent.futures

    body = {"prompt": "Count: 1, 2,", "max_tokens": 60, "ignore_eos": True}

    def one(_: int) -> httpx.Response:
        return httpx.post(server.url + "/v1/completions", json=body, headers={"X-Request-Id": "trace-7"}, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(one, range(2)))
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert {a.json()["id"] for a in answers} == {"cmpl-trace-7"}
