"""Bad input gets the right status and an OpenAI-shaped error naming the problem, and the
server keeps serving afterwards."""

from __future__ import annotations

import json
import re

import httpx
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
GOOD_TOOL = {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}
BAD_TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}}}}


def call(server, path: str, body=None, content: bytes | None = None, headers=None) -> httpx.Response:
    return httpx.post(server.url + path, json=body, content=content, headers=headers, timeout=60)


def assert_error(resp: httpx.Response, status: int, *words: str, param: str | None = None) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert "Traceback" not in err["message"]
    for w in words:
        assert w in err["message"], (w, err["message"])
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize(
    ("path", "body", "status", "words", "param"),
    [
        ("/v1/chat/completions", {**CHAT, "temperature": -1}, 400, ["temperature"], None),
        ("/v1/chat/completions", {**CHAT, "messages": []}, 400, ["messages"], "messages"),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400, ["role"], "messages[0].role"),
        ("/v1/chat/completions", {**CHAT, "model": "gpt-9"}, 404, ["gpt-9"], "model"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 100_000}, 400, ["8192", "100", "maximum context length"], "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400, ["logprobs"], "top_logprobs"),
        ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400, ["tools[0].function"], "tools[0].function"),
        ("/v1/chat/completions", {**CHAT, "tools": [GOOD_TOOL, {"type": "custom", "custom": {"name": "x"}}]}, 400,
         ["only function tools", "'custom'"], "tools[1].type"),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "structural_tag"}}, 400,
         ["structural_tag is not supported"], "response_format"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, ["top_p"], None),
        ("/v1/completions", {"model": MODEL, "prompt": [[1, 2], [999_999]]}, 400, ["token ids"], "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": []}, 400, ["prompt"], None),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 50}, 400, ["logprobs"], "logprobs"),
        ("/generate", {"text": "a", "input_ids": [1]}, 400, ["exactly one"], "text"),
        ("/generate", {"input_ids": [5, -1]}, 400, ["token ids"], "input_ids"),
        ("/generate", {"text": "a", "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 2}}, 400, ["min_new_tokens"], None),
        ("/generate", {"text": "a", "sampling_params": {"regex": "[ab"}}, 400, ["regex cannot be compiled"], "regex"),
        ("/generate", {"text": "a", "return_logprob": True, "logprob_start_len": -2}, 400, ["logprob_start_len", "-1"], "logprob_start_len"),
        ("/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": -1}, 400, ["top_logprobs_num"], "top_logprobs_num"),
        # 49,152 top logprobs per token took the server's memory (each pickled through three processes)
        ("/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": 21}, 400, ["[0, 20]", "--max-logprobs"],
         "top_logprobs_num"),
        ("/generate", {"text": "a", "image_data": "x.png"}, 400, ["image_data", "not supported"], "image_data"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 10**6}}, 400, ["maximum context length"],
         "max_new_tokens"),
        # as SGLang without --allow-auto-truncate: prompt + max_new_tokens past the context is refused
        ("/generate", {"input_ids": [7] * 100, "sampling_params": {"max_new_tokens": 8100}}, 400,
         ["maximum context length is 8192", "8200 tokens (100 in the prompt, 8100"], "max_new_tokens"),
        ("/generate", {"input_ids": [7] * 8192}, 400, ["the prompt alone has 8192"], "input_ids"),
        # the Responses API's own names in its errors
        ("/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 9000}, 400,
         ["maximum context length"], "max_output_tokens"),
        # a client's quoted value stays as it sent it
        ("/v1/chat/completions", {**CHAT, "stop_regex": ["max_new_tokens("]}, 400, ["'max_new_tokens('"], "stop_regex"),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "#/defs/min_new_tokens"}}}}, 400, ["#/defs/min_new_tokens"], "response_format"),
        # SGLang's json_schema on completions is named as sent, not as response_format
        ("/v1/completions", {"model": MODEL, "prompt": "x", "json_schema": "{oops"}, 400, ["json_schema"], "json_schema"),
        # values the sampler cannot use: each once took the whole server down
        ("/v1/chat/completions", {**CHAT, "min_tokens": 2, "stop_token_ids": [100_000]}, 400, ["stop_token_ids", "49152"], "stop_token_ids"),
        ("/generate", {"text": "a", "sampling_params": {"min_new_tokens": 1, "stop_token_ids": [49152]}}, 400, ["vocabulary"], "stop_token_ids"),
        ("/v1/chat/completions", {**CHAT, "temperature": 1e39, "min_tokens": 2}, 400, ["temperature"], "temperature"),
        ("/v1/chat/completions", {**CHAT, "temperature": 1.0, "repetition_penalty": 1e-300}, 400, ["repetition_penalty"], "repetition_penalty"),
        ("/generate", {"text": "a", "sampling_params": {"skip_special_tokens": "no"}}, 400, ["true or false"], "skip_special_tokens"),
        ("/generate", {"text": "a", "sampling_params": {"ignore_eos": "false"}}, 400, ["true or false"], "ignore_eos"),
        ("/v1/completions", {"model": MODEL, "prompt": [1, -5]}, 400, ["token ids"], "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [2**32]}, 400, ["token ids"], "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [[1, 2], [3, -1]], "echo": True}, 400, ["token ids"], "prompt"),
        # as OpenAI and vLLM: stream_options only with stream
        ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}, 400, ["stream_options"], "stream_options"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": False, "stream_options": {"include_usage": True}},
         400, ["stream_options"], "stream_options"),
        # OpenAI's names in OpenAI's errors; n within OpenAI's limit
        ("/v1/chat/completions", {**CHAT, "min_tokens": 9}, 400, ["min_tokens"], "min_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "min_tokens": 5}, 400,
         ["min_tokens must not exceed max_tokens"], "min_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 3, "best_of": 1}, 400, ["best_of must be at least n"],
         "best_of"),
        ("/v1/completions", {"model": MODEL, "prompt": [7] * 8192, "max_tokens": 0}, 400,
         ["maximum context length is 8192", "the prompt alone has 8192"], "prompt"),
        ("/v1/chat/completions", {**CHAT, "n": 129}, 400, ["n must be in [1, 128]"], "n"),
        # JSON types as OpenAI checks them: no numbers or booleans written as strings
        ("/v1/chat/completions", {**CHAT, "temperature": "0.5"}, 400, ["temperature"], "temperature"),
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}, 400, ["stream"], "stream"),
        ("/generate", {"text": "a", "stream": "yes"}, 400, ["stream"], "stream"),
        # a tool schema the grammar engine refuses: the client's error, not the server's
        ("/v1/chat/completions", {**CHAT, "tools": [BAD_TOOL]}, 400, ["tool 'f'", "minimum greater than maximum"], "tools"),
        ("/v1/chat/completions", {**CHAT, "tools": [BAD_TOOL], "stream": True}, 400, ["tool 'f'"], "tools"),
        ("/v1/responses", {"model": MODEL, "input": "Hi", "tools": [{"type": "function", **BAD_TOOL["function"]}]}, 400,
         ["tool 'f'"], "tools"),
        ("/tokenize", {"messages": CHAT["messages"], "tools": [BAD_TOOL]}, 400, ["tool 'f'"], "tools"),
        # tools beside another constraint, however it is named; two JSON schemas
        ("/v1/chat/completions", {**CHAT, "tools": [GOOD_TOOL], "json_schema": {"type": "object"}}, 400,
         ["cannot be combined"], "tools"),
        ("/v1/chat/completions", {**CHAT, "tools": [GOOD_TOOL], "structured_outputs": {"json": {"type": "object"}}},
         400, ["cannot be combined"], "tools"),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}, "guided_json": {"type": "object"}},
         400, ["not both"], "response_format"),
        ("/v1/chat/completions", {**CHAT, "tools": [GOOD_TOOL], "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}}, 400, ["response_format schema"],
         "response_format"),
        # constraints: a strict schema part no engine would enforce (without strict: best effort);
        # two constraints, however named; empty ones
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "strict": True, "schema": {
                "type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}}}}}, 400,
         ["cannot be enforced", "uniqueItems", "properties.t"], "response_format"),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "strict": True, "schema": {"type": "string", "pattern": "^(?!b)[a-z]+$"}}}}, 400,
         ["look-around"], "response_format"),
        ("/generate", {"text": "a", "sampling_params": {"json_schema": '{"type": "array", "uniqueItems": true}'}}, 400,
         ["uniqueItems"], "json_schema"),
        ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
            "type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}}}]}, 400,
         ["strict tool 'f'", "uniqueItems"], "tools"),
        ("/v1/chat/completions", {**CHAT, "regex": "a", "guided_regex": "b"}, 400, ["regex", "guided_regex"], "guided_regex"),
        ("/v1/chat/completions", {**CHAT, "regex": "a", "structured_outputs": {"regex": "a"}, "guided_regex": "b"}, 400,
         ["guided_regex"], "guided_regex"),  # the same one twice is one; a third, different, is not
        ("/v1/chat/completions", {**CHAT, "regex": "a", "guided_choice": ["x"]}, 400, ["guided_choice"], "guided_choice"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "structured_outputs": {"regex": "a", "choice": ["x"]}}, 400,
         ["structured_outputs.choice"], "structured_outputs.choice"),
        ("/v1/chat/completions", {**CHAT, "regex": ""}, 400, ["non-empty"], "regex"),
        ("/v1/chat/completions", {**CHAT, "guided_choice": []}, 400, ["at least one"], "guided_choice"),
        ("/v1/chat/completions", {**CHAT, "guided_regex": "[ab"}, 400, ["guided_regex cannot be compiled"], "guided_regex"),
        ("/v1/chat/completions", {**CHAT, "structured_outputs": {"json": {"type": "integer", "minimum": 5, "maximum": 1}}},
         400, ["structured_outputs.json"], "structured_outputs.json"),
        ("/v1/chat/completions", {**CHAT, "guided_json": 5}, 400, ["guided_json"], "guided_json"),
        ("/v1/chat/completions", {**CHAT, "guided_whitespace_pattern": " "}, 400, ["guided_whitespace_pattern"],
         "guided_whitespace_pattern"),
    ],
)
def test_bad_input(server, path, body, status, words, param):
    assert_error(call(server, path, body), status, *words, param=param)


def test_prompt_beyond_context_names_the_numbers(server):
    long_ids = [100] * 8200
    resp = call(server, "/v1/completions", {"model": MODEL, "prompt": long_ids, "max_tokens": 1})
    assert_error(resp, 400, "8192", "8200", param="prompt")


def test_a_huge_prompt_is_refused_from_its_start_and_tokenized_whole_only_when_asked(server, engine):
    """A 20 MB prompt took 1.7 GB of the HTTP process to tokenize before the context check
    refused it (a few at once, or a stored conversation of that size, and the server was
    killed for memory). The generating routes tokenize only as many characters as can
    matter: more tokens than the context even for the longest tokens there are."""
    hf = engine.tokenizer.hf
    longest = max(hf.get_vocab(), key=len)
    context = engine.scheduler.max_context_len
    cap = 2 * len(longest) * (context + 1)  # the server's rule (ServerContext.longest_useful_text)
    worst = hf.convert_tokens_to_string([longest]) * (cap // len(longest) + 1)
    assert len(engine.tokenizer.encode(worst[:cap])) > context  # what is cut off never decides anything
    huge = "The sea is wide. " * 120_000  # 2 MB
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": huge, "max_tokens": 1}),
                       ("/v1/completions", {"model": MODEL, "prompt": huge, "max_tokens": 1,
                                            "truncate_prompt_tokens": 10**9}),  # cuts nothing of it
                       ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": huge}]}),
                       ("/generate", {"text": huge})):
        resp = call(server, path, body)
        assert resp.status_code == 400 and "context" in resp.text, resp.text
        # the count it gives is said to be of the part it tokenized, not of the whole prompt
        message = resp.json()["error"]["message"]
        assert re.search(f"in its (first|last) {cap:,} characters alone", message) and "alone has" not in message, message
    counted = call(server, "/tokenize", {"model": MODEL, "prompt": huge}).json()["count"]
    assert counted == len(engine.tokenizer.encode(huge, add_special_tokens=True))  # /tokenize: all of it


def test_invalid_json_and_wrong_shape(server):
    assert_error(call(server, "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}), 400, "JSON")
    assert_error(call(server, "/generate", content=b"[1, 2]"), 400, "object")


def test_unknown_routes_and_methods_answer_in_the_error_shape(server):
    assert_error(httpx.get(server.url + "/v1/no-such-route"), 404, "Not Found")
    resp = httpx.get(server.url + "/generate")
    assert_error(resp, 405, "Method Not Allowed")
    assert "POST" in resp.headers["allow"]


def test_an_unexpected_error_is_a_json_500_that_keeps_the_connection():
    """The middleware answers what no handler did, instead of re-raising into the server
    (which then closes the client's keep-alive connection)."""
    import asyncio

    from runtime.server.http_server import UnexpectedErrorAsJson

    async def broken_app(scope, receive, send):
        raise KeyError("boom")

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/x", "headers": []}
    asyncio.run(UnexpectedErrorAsJson(broken_app)(scope, receive, send))  # does not raise
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 500
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert b'"internal error: KeyError"' in body and b"boom" not in body


def test_unknown_model_lookup_is_404(server):
    resp = httpx.get(server.url + "/v1/models/no-such-model")
    assert_error(resp, 404, "no-such-model")
    # "unknown" in a body is the gateway's "no model named"; as a model to look up it is none
    assert_error(httpx.get(server.url + "/v1/models/unknown"), 404, "unknown")


def test_still_serving_after_errors(server):
    # ignore_eos: sampled at temperature 1, EOS is the first token ~10% of the time here
    resp = call(server, "/generate", {"text": "Still alive?", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
    assert resp.status_code == 200 and resp.json()["meta_info"]["completion_tokens"] == 2
    assert server.info()["scheduler"]["kv_invariant_holds"] is True


def test_a_huge_prompt_does_not_stall_other_clients(server):
    """Tokenizing megabytes of text runs off the event loop: /health answers while it runs."""
    import concurrent.futures
    import time

    huge = {"model": MODEL, "prompt": "lorem ipsum dolor sit amet " * 300_000, "max_tokens": 1}  # 8 MB

    def big() -> tuple[httpx.Response, float]:
        start = time.perf_counter()
        return call(server, "/v1/completions", huge), time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(big)
        time.sleep(0.5)  # the body is sent and tokenizing has begun
        start = time.perf_counter()
        assert httpx.get(server.url + "/health", timeout=60).status_code == 200
        health_s = time.perf_counter() - start
        resp, big_s = fut.result()
    assert_error(resp, 400, "maximum context length", param="prompt")
    assert health_s < big_s / 4, (health_s, big_s)


def test_a_request_failed_by_the_scheduler_names_its_field_in_the_route_s_words():
    """A failure the scheduler reports with a field (a grammar that did not compile in time)
    is a 400 whose param is that field: SGLang's name on /generate, OpenAI's on /v1."""
    from runtime.server.openai_constraint import OPENAI_NAMES as _OPENAI_NAMES
    from runtime.server.responses import error_of
    from runtime.server.scheduler_client import ReqState

    state = ReqState("r", 5, False, 1, error="its json_schema did not compile within 30 s", error_param="json_schema")
    assert error_of(state).param == "json_schema"
    assert error_of(state, _OPENAI_NAMES).param == "response_format"
    assert error_of(state, _OPENAI_NAMES).status == 400
    assert error_of(ReqState("q", 5, False, 1)) is None


@pytest.mark.parametrize(("method", "path", "words"), [
    ("POST", "/v1/embeddings", "text-generation model"),
    ("POST", "/v1/audio/transcriptions", "text only"),
    ("GET", "/v1/files", "not served here"),
    ("GET", "/v1/chat/completions", "not stored here"),
    ("GET", "/v1/chat/completions/chatcmpl-1/messages", "not stored here"),
    ("POST", "/v1/messages", "Anthropic"),
    ("POST", "/load_lora_adapter", "LoRA"),
    ("POST", "/update_weights_from_disk", "restart it"),
    ("POST", "/open_session", "sessions"),
    ("POST", "/concate_and_append_request", "gather_variable"),
])
def test_routes_other_servers_have_say_what_to_use(server, method, path, words):
    resp = httpx.request(method, server.url + path, json={})
    assert resp.status_code in (404, 405)
    assert words in resp.json()["error"]["message"] and path in resp.json()["error"]["message"]


def test_sglang_health_aliases_and_sagemaker_invocations(server):
    assert httpx.get(server.url + "/ping").status_code == 200
    assert httpx.get(server.url + "/ready").status_code == 200
    resp = httpx.post(server.url + "/invocations", json={"model": MODEL, "max_tokens": 2,
                                                          "messages": [{"role": "user", "content": "Hi"}]})
    assert resp.status_code == 200 and resp.json()["object"] == "chat.completion"


def test_sglang_parse_routes_use_the_chat_routes_parsers(server):
    """``/parse_function_call`` and ``/separate_reasoning`` in SGLang's shapes; the oracle is
    the text as written (the calls' JSON, the split at ``</think>``)."""
    tools = [GOOD_TOOL, {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    text = 'Let me check.<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for parser in ("hermes", None):  # the default model's: hermes, from its template
        body = {"text": text, "tools": tools, **({"tool_call_parser": parser} if parser else {})}
        out = call(server, "/parse_function_call", body).json()
        assert out["normal_text"] == "Let me check."
        assert [(c["tool_index"], c["name"], json.loads(c["parameters"])) for c in out["calls"]] == [
            (1, "weather", {"city": "Paris"})]
    assert_error(call(server, "/parse_function_call", {"text": "x", "tool_call_parser": "nope"}), 400, "nope",
                 param="tool_call_parser")
    assert_error(call(server, "/parse_function_call", {"text": text, "tools": [{"function": "str"}]}), 400,
                 param="tools[0].function")
    out = call(server, "/separate_reasoning", {"text": "I think so.</think>Yes.", "reasoning_parser": "deepseek-r1",
                                               "return_blocks": True}).json()
    assert (out["reasoning_text"], out["text"]) == ("I think so.", "Yes.")
    assert out["blocks"] == [{"type": "reasoning", "text": "I think so."}, {"type": "text", "text": "Yes."}]
    assert_error(call(server, "/separate_reasoning", {"text": "x", "reasoning_parser": "nope"}), 400,
                 param="reasoning_parser")


def test_a_request_without_model_is_for_the_served_one(server):
    """SGLang and vLLM take a request with no ``model`` (a curl written for them) as for the
    served model; a model named is still checked."""
    chat = {k: v for k, v in CHAT.items() if k != "model"}
    assert call(server, "/v1/chat/completions", chat).json()["model"] == MODEL
    assert call(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}).json()["model"] == MODEL
    assert call(server, "/v1/responses", {"input": "Hi", "max_output_tokens": 2}).json()["model"] == MODEL
    assert_error(call(server, "/v1/completions", {"prompt": "Hi", "model": "gpt-9"}), 404, "gpt-9", param="model")
