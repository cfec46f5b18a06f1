"""What real clients send is accepted: every OpenAI request field with ``null`` meaning
"not given", the extra fields of SGLang's gateway and of vLLM's clients, unknown fields
ignored with one warning; each value the server cannot honour is a 400 naming its field.
Plus the fields that are implemented here: ``n`` with a seed, ``continue_final_message``,
vLLM's ``guided_*`` and ``include_stop_str_in_output``, cache keys."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "Name a planet."}]

# As the openai client, LangChain and hand-written clients send them: every optional field null.
OPENAI_NULLS = {
    "audio": None, "frequency_penalty": None, "function_call": None, "functions": None, "logit_bias": None,
    "logprobs": None, "max_completion_tokens": None, "metadata": None, "modalities": None, "n": None,
    "parallel_tool_calls": None, "prediction": None, "presence_penalty": None, "prompt_cache_key": None,
    "reasoning_effort": None, "response_format": None, "safety_identifier": None, "seed": None,
    "service_tier": None, "stop": None, "store": None, "stream": None, "stream_options": None,
    "temperature": None, "tool_choice": None, "tools": None, "top_logprobs": None, "top_p": None, "user": None,
    "verbosity": None, "web_search_options": None, "moderation": None, "prompt_cache_options": None,
    "prompt_cache_retention": None,
}
# Values that change nothing here, as clients set them.
OPENAI_HARMLESS = {"user": "user-1", "metadata": {"run": "7"}, "store": False, "service_tier": "auto",
                   "parallel_tool_calls": True, "prompt_cache_key": "k", "safety_identifier": "s",
                   "modalities": ["text"], "tool_choice": "none", "verbosity": "medium",
                   "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
                   "reasoning_effort": "high"}  # the model does not reason: no reasoning at any effort
# What SGLang's model gateway forwards on the chat route (its own fields at their defaults).
GATEWAY_CHAT = {"continue_final_message": False, "separate_reasoning": True, "stream_reasoning": True,
                "no_stop_trim": False, "return_hidden_states": False, "skip_special_tokens": True,
                "lora_path": None, "session_params": None, "rid": None, "chat_template_kwargs": None,
                "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None, "top_k": -1, "min_p": 0.0,
                "min_tokens": 0, "repetition_penalty": 1.0, "stop_token_ids": None, "ignore_eos": False,
                "regex": None, "ebnf": None, "json_schema": None, "priority": None}
# ... and on /generate.
GATEWAY_GENERATE = {"model": None, "log_metrics": True, "no_logs": False, "background": False, "return_bytes": False,
                    "return_entropy": False, "return_hidden_states": False, "lora_path": None, "stream": False,
                    "rid": None, "image_data": None, "bootstrap_host": None, "data_parallel_rank": None}


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


@pytest.mark.parametrize("extra", [OPENAI_NULLS, OPENAI_HARMLESS, GATEWAY_CHAT], ids=["nulls", "harmless", "gateway"])
def test_chat_bodies_clients_send_are_accepted(server, extra):
    resp = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **extra})
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["role"] == "assistant"


def test_completion_and_generate_bodies_with_nulls_and_gateway_fields(server):
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "n": None, "best_of": None, "echo": None,
            "logprobs": None, "suffix": None, "user": None, "stream": None, "seed": None, "logit_bias": None}
    assert post(server, "/v1/completions", body).status_code == 200
    resp = post(server, "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 3}, **GATEWAY_GENERATE})
    assert resp.status_code == 200, resp.text
    # as SGLang without --enable-priority-scheduling: served in its turn (vLLM refuses it on its routes)
    resp = post(server, "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 3}, "priority": 5})
    assert resp.status_code == 200, resp.text


def test_whole_floats_for_integer_fields_are_those_integers(server):
    """``2.0`` where an integer goes (a client that computed it), as vLLM and SGLang take it;
    ``2.5`` stays a 400."""
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2.0, "n": 2.0, "seed": 5.0, "top_k": 5.0,
            "temperature": 1, "ignore_eos": True}
    resp = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["choices"]) == 2 and resp.json()["usage"]["completion_tokens"] == 4
    native = httpx.post(f"{server.url}/generate", json={"text": "Hello", "sampling_params": {
        "max_new_tokens": 3.0, "ignore_eos": True}}, timeout=60)
    assert native.status_code == 200 and native.json()["meta_info"]["completion_tokens"] == 3
    assert httpx.post(f"{server.url}/v1/completions", json={**body, "max_tokens": 2.5}, timeout=60).status_code == 400


def test_an_explicit_cache_breakpoint_changes_nothing(server):
    """Every prefix is cached here, so OpenAI's ``prompt_cache_breakpoint`` on a text part is
    accepted and the answer is the one to the same text as a plain string."""
    parts = [{"role": "user", "content": [{"type": "text", "text": MESSAGES[0]["content"],
                                           "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"}}]}]
    answers = [post(server, "/v1/chat/completions", {"model": MODEL, "messages": m, "max_tokens": 6, "temperature": 0})
               for m in (parts, MESSAGES)]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert answers[0].json()["choices"][0]["message"] == answers[1].json()["choices"][0]["message"]


def test_unknown_fields_are_ignored_with_one_warning(server):
    for _ in range(2):
        resp = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 2,
                                                      "frobnicate_level": 3})
        assert resp.status_code == 200, resp.text
    log = server.read_output()
    assert log.count("ignoring unknown request field 'frobnicate_level'") == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logit_bias", {"42": 101}), ("logit_bias", {"999999": 1}), ("audio", {"voice": "alloy", "format": "mp3"}),
        ("prediction", {"type": "content", "content": "x"}),
        ("web_search_options", {}), ("modalities", ["text", "audio"]),
        ("moderation", {"model": "omni-moderation-latest"}),
        ("return_hidden_states", True), ("lora_path", "adapter"),
        ("tool_choice", "required"), ("use_beam_search", True), ("allowed_token_ids", [1, 2]),
    ],
)
def test_values_we_cannot_honour_are_400s_naming_the_field(server, field, value):
    resp = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, field: value})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field


@pytest.mark.parametrize(("route", "field", "value"), [
    ("/v1/completions", "suffix", " the end."), ("/v1/completions", "prompt_embeds", "AAAA"),
    ("/generate", "token_ids_logprob", [1, 2]), ("/v1/chat/completions", "priority", 5), ("/v1/responses", "context_management", [{"type": "compaction"}]),
])
def test_each_route_refuses_what_it_cannot_honour(server, route, field, value):
    body = {"/v1/completions": {"model": MODEL, "prompt": "Hello", "max_tokens": 2},
            "/generate": {"text": "Hello", "sampling_params": {"max_new_tokens": 2}},
            "/v1/chat/completions": {"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
            "/v1/responses": {"model": MODEL, "input": "Hello", "max_output_tokens": 2}}[route]
    resp = post(server, route, {**body, field: value})
    assert resp.status_code == 400, resp.text
    assert field in resp.text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "system", "content": None}, *MESSAGES]}, "messages[0].content"),
        ({"messages": [*MESSAGES, {"role": "assistant", "content": "Mars."}, {"role": "user", "content": None}]},
         "messages[2].content"),
    ],
    ids=["max_tokens", "max_completion_tokens", "user", "system", "late_user"],
)
def test_what_openai_requires_of_a_chat_is_a_400(server, body, param):
    """A chat answer of at least one token (completions' echo may ask for none), and content on
    every turn but the assistant's."""
    resp = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, **body})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_images_are_refused_and_types_still_checked(server):
    image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]
    resp = post(server, "/v1/chat/completions", {"model": MODEL, "messages": image, "max_tokens": 2})
    assert resp.status_code == 400 and "image_url" in resp.json()["error"]["message"]
    resp = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "n": "2"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "n"


def test_n_seeded_samples_differ_and_repeat(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Write a short poem about the sea."}],
              n=4, seed=1, temperature=1.0, max_tokens=12)
    first = [c.message.content for c in client.chat.completions.create(**kw).choices]
    again = [c.message.content for c in client.chat.completions.create(**kw).choices]
    assert len(set(first)) == 4 and first == again


def test_continue_final_message(server, engine):
    partial = [{"role": "user", "content": "What is the capital of France?"},
               {"role": "assistant", "content": "The capital of France is"}]
    resp = post(server, "/v1/chat/completions", {"model": MODEL, "messages": partial, "max_tokens": 6,
                                                  "temperature": 0, "continue_final_message": True})
    assert resp.status_code == 200, resp.text
    prompt = engine.tokenizer.apply_chat_template(partial, add_generation_prompt=False, continue_final_message=True)
    assert prompt.endswith("The capital of France is")
    want = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 6})
    assert resp.json()["choices"][0]["message"]["content"] == want["text"]


def test_vllm_guided_fields_and_stop_string_kept(server):
    resp = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 0,
                                                  "guided_choice": ["Mars", "Venus", "Jupiter"]})
    assert resp.json()["choices"][0]["message"]["content"] in ("Mars", "Venus", "Jupiter")
    plain = post(server, "/v1/completions", {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 12, "temperature": 0,
                                             "stop": [" 5"]}).json()["choices"][0]["text"]
    kept = post(server, "/v1/completions", {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 12, "temperature": 0,
                                            "stop": [" 5"], "include_stop_str_in_output": True}).json()["choices"][0]["text"]
    assert kept == plain + " 5"
    # a stop string inside a token: the text ends with it (vLLM), not with the token's rest
    story = {"model": MODEL, "prompt": "Once upon a time, in a small village,", "max_tokens": 30, "temperature": 0}
    full = post(server, "/v1/completions", story).json()["choices"][0]["text"]
    assert "r" in full, full
    kept = post(server, "/v1/completions", {**story, "stop": ["r"], "include_stop_str_in_output": True}).json()
    assert kept["choices"][0]["text"] == full[: full.index("r") + 1], (full, kept)


def test_truncate_prompt_tokens_keeps_the_prompts_end_or_start(server, engine):
    """vLLM's ``truncate_prompt_tokens`` (it was refused): the answer is the one to the kept
    tokens; ``truncation_side: "right"`` keeps the start; 0 is a 400 (an empty prompt)."""
    prompt = "Notes: apples are red, the sky is blue, grass is green. Question: what colour is grass? Answer:"
    ids = engine.tokenizer.encode(prompt)
    base = {"model": MODEL, "max_tokens": 4, "temperature": 0, "echo": True}
    for side, kept in ((None, ids[-12:]), ("right", ids[:12])):
        side_field = {"truncation_side": side} if side else {}
        cut = post(server, "/v1/completions", {**base, "prompt": prompt, "truncate_prompt_tokens": 12, **side_field}).json()
        want = post(server, "/v1/completions", {**base, "prompt": kept}).json()
        assert cut["usage"]["prompt_tokens"] == 12 and cut["choices"][0]["text"] == want["choices"][0]["text"]
    whole = post(server, "/v1/completions", {**base, "prompt": prompt, "truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == len(ids)
    chat = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 2,
                                                 "truncate_prompt_tokens": 5}).json()
    assert chat["usage"]["prompt_tokens"] == 5
    resp = post(server, "/v1/completions", {**base, "prompt": prompt, "truncate_prompt_tokens": 0})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "truncate_prompt_tokens"


def test_what_stopped_a_choice_is_named_as_vllm_and_sglang_name_it(server):
    """vLLM's ``stop_reason`` (the stop string or ``stop_token_ids`` id; null for EOS and
    length) and SGLang's ``matched_stop`` (any matched string or id), whole and streamed."""
    base = {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 12, "temperature": 0}
    plain = post(server, "/v1/completions", {**base, "return_token_ids": True}).json()["choices"][0]
    assert plain["stop_reason"] is None and plain["matched_stop"] is None  # length
    third = plain["token_ids"][2]
    cases = [({"stop": [" 5"]}, " 5", " 5"), ({"stop_token_ids": [third]}, third, third)]
    for extra, stop_reason, matched in cases:
        whole = post(server, "/v1/completions", {**base, **extra}).json()["choices"][0]
        assert (whole["finish_reason"], whole["stop_reason"], whole["matched_stop"]) == ("stop", stop_reason, matched)
        with httpx.stream("POST", server.url + "/v1/completions", json={**base, **extra, "stream": True}, timeout=60) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        last = [c["choices"][0] for c in chunks if c["choices"]][-1]
        assert (last["finish_reason"], last["stop_reason"], last["matched_stop"]) == ("stop", stop_reason, matched)
    eos = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 40,
                                                "temperature": 0}).json()["choices"][0]
    assert eos["finish_reason"] == "stop" and eos["stop_reason"] is None and isinstance(eos["matched_stop"], int)


@pytest.mark.parametrize(("extra", "check"), [
    ({"structured_outputs": {"choice": ["maybe", "never"]}}, lambda t: t in ("maybe", "never")),
    ({"structured_outputs": {"regex": "[0-9]{3}"}}, lambda t: re.fullmatch("[0-9]{3}", t)),
    ({"structured_outputs": {"json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                                      "additionalProperties": False}}},
     lambda t: set(json.loads(t)) == {"n"}),
    ({"structured_outputs": {"json_object": True}}, lambda t: t.startswith("{")),  # an object (40 tokens may cut it)
    ({"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}}, lambda t: t in ("yes", "no")),
    ({"json_schema": json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 3})},  # SGLang's
     lambda t: isinstance(json.loads(t), list)),
], ids=["choice", "regex", "json", "json_object", "grammar", "json_schema"])
def test_constraints_as_vllm_and_sglang_clients_send_them_are_kept(server, extra, check):
    """vLLM's ``structured_outputs`` (its clients' successor to ``guided_*``) and SGLang's
    ``json_schema`` constrain the answer on both routes, not just pass."""
    chat = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 40,
                                                  "temperature": 0, **extra})
    completion = post(server, "/v1/completions", {"model": MODEL, "prompt": "Answer:", "max_tokens": 40,
                                                  "temperature": 0, **extra})
    assert check(chat.json()["choices"][0]["message"]["content"]), chat.text
    assert check(completion.json()["choices"][0]["text"]), completion.text


def test_structured_outputs_options_we_cannot_honour_are_400s(server):
    resp = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 4,
                                                  "structured_outputs": {"regex": "a+", "whitespace_pattern": " "}})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "structured_outputs.whitespace_pattern"
    both = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 4,
                                                  "structured_outputs": {"regex": "a+", "json": {"type": "object"}}})
    assert both.status_code == 400, both.text


def test_a_body_over_the_limit_is_413_before_parsing(server):
    resp = httpx.post(server.url + "/v1/completions", content=b" " * (33 * 2**20),
                      headers={"content-type": "application/json"}, timeout=120)
    assert resp.status_code == 413 and "at most" in resp.json()["error"]["message"]
    assert post(server, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1}).status_code == 200


def test_unknown_sampling_params_are_ignored_with_one_warning_and_known_ones_checked(server):
    """Inside /generate's sampling_params: a name no sampling parameter has is ignored (one
    log line per name), SGLang's fields we lack are fine at their neutral value and a 400
    naming them otherwise, sampling_seed is SGLang's name for seed, and a known field with
    the wrong type is still a 400 naming it."""
    greedy = {"max_new_tokens": 4, "temperature": 0}
    want = post(server, "/generate", {"text": "Count: 1, 2,", "sampling_params": greedy}).json()["text"]
    for _ in range(2):
        resp = post(server, "/generate", {"text": "Count: 1, 2,", "sampling_params": {**greedy, "wibble_factor": 9}})
        assert resp.status_code == 200, resp.text
        assert resp.json()["text"] == want
    assert server.read_output().count("ignoring unknown sampling parameter 'wibble_factor'") == 1
    neutral = {"structural_tag": None, "custom_params": None, "logit_bias": None}
    assert post(server, "/generate", {"text": "Hi", "sampling_params": {**greedy, **neutral, "stream_interval": 2}}).status_code == 200
    for field, value in [("logit_bias", {"42": "much"}), ("structural_tag", "{}"), ("max_new_tokens", "4")]:
        resp = post(server, "/generate", {"text": "Hi", "sampling_params": {**greedy, field: value}})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == field, resp.text
    sampled = {"max_new_tokens": 8, "temperature": 1.0}
    by_seed = post(server, "/generate", {"text": "Once", "sampling_params": {**sampled, "seed": 7}}).json()["text"]
    by_sglang = post(server, "/generate", {"text": "Once", "sampling_params": {**sampled, "sampling_seed": 7}}).json()
    assert by_sglang["text"] == by_seed


def test_logprob_start_len_past_the_prompt_is_400(server):
    body = {"input_ids": [1, 2, 3], "return_logprob": True, "sampling_params": {"max_new_tokens": 1}}
    resp = post(server, "/generate", {**body, "logprob_start_len": 4})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "logprob_start_len"
    at_the_end = post(server, "/generate", {**body, "logprob_start_len": 3})  # SGLang's: none of the prompt's
    assert at_the_end.status_code == 200, at_the_end.text
    assert at_the_end.json()["meta_info"]["input_token_logprobs"] == []


def test_openapi_documents_every_request_body(server):
    spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
    schemas = spec["components"]["schemas"]
    for path, model, field in [("/v1/chat/completions", "ChatCompletionRequest", "messages"),
                               ("/v1/completions", "CompletionRequest", "prompt"),
                               ("/generate", "GenerateReqInput", "sampling_params")]:
        ops = spec["paths"][path]
        body = next(iter(ops.values()))["requestBody"]["content"]["application/json"]["schema"]
        assert body["$ref"].endswith("/" + model) and field in schemas[model]["properties"]
    refs = {ref.rsplit("/", 1)[1] for ref in _refs(spec)}
    assert refs <= set(schemas), refs - set(schemas)  # every $ref resolves
    assert httpx.get(server.url + "/docs", timeout=30).status_code == 200


def _refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_logprobs_of_tokens_a_grammar_rules_out_are_numbers(server):
    """A token the constraint rules out has logprob -inf, which JSON can only write as null;
    the OpenAI routes report vLLM's floor, -9999.0, where OpenAI's schema has a number."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 3, "temperature": 0, "regex": "(yes|no)",
            "logprobs": True, "top_logprobs": 20}
    content = post(server, "/v1/chat/completions", body).json()["choices"][0]["logprobs"]["content"]
    values = [e["logprob"] for e in content] + [t["logprob"] for e in content for t in e["top_logprobs"]]
    assert all(isinstance(v, float) and v >= -9999.0 for v in values), values
    assert -9999.0 in values  # after "yes" or "no" only the end is allowed: the other 19 are ruled out
    legacy = post(server, "/v1/completions", {"model": MODEL, "prompt": "Answer:", "max_tokens": 3, "temperature": 0,
                                              "regex": "(yes|no)", "logprobs": 5}).json()["choices"][0]["logprobs"]
    tops = [v for top in legacy["top_logprobs"] for v in top.values()]
    assert all(isinstance(v, float) for v in legacy["token_logprobs"] + tops) and -9999.0 in tops


def test_schemas_xgrammar_would_not_enforce_are_kept_by_llguidance(server):
    """pydantic's ``Field(pattern=..., max_length=...)`` (xgrammar drops the length) and a
    pattern whose matches need escapes in JSON (xgrammar wrote them raw): compiled by
    llguidance instead, the answers follow the schema."""
    from pydantic import BaseModel, Field

    class Tag(BaseModel):
        tag: str = Field(pattern=r"^[a-z]+$", max_length=3)

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    for seed in range(3):
        parsed = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Give a tag"}],
                                               response_format=Tag, temperature=1, seed=seed, max_tokens=30)
        assert parsed.choices[0].message.parsed is not None  # validated by pydantic itself
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": '^a"b$'}}, "required": ["s"]}
    out = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 20, "temperature": 0,
                                                "response_format": {"type": "json_schema",
                                                                    "json_schema": {"name": "q", "schema": schema}}})
    assert json.loads(out.json()["choices"][0]["message"]["content"]) == {"s": 'a"b'}


def test_one_constraint_under_both_servers_names_is_one_constraint(server):
    """A client written for SGLang and vLLM alike sends ``regex`` and
    ``structured_outputs.regex`` with the same value: one constraint, not a 400."""
    resp = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "temperature": 0,
                                                 "regex": "[0-9]+", "structured_outputs": {"regex": "[0-9]+"}})
    assert resp.status_code == 200 and re.fullmatch("[0-9]+", resp.json()["choices"][0]["message"]["content"]), resp.text


def test_json_schemas_boolean_forms(server):
    """JSON Schema's ``true`` (any JSON value) is taken as a response_format schema; ``false``
    (no value at all) is a 400 naming response_format."""
    def ask(schema: bool) -> httpx.Response:
        return post(server, "/v1/chat/completions", {
            "model": MODEL, "messages": MESSAGES, "max_tokens": 30, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "any", "schema": schema}}})

    anything = ask(True)
    assert anything.status_code == 200, anything.text
    choice = anything.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        json.loads(choice["message"]["content"])
    nothing = ask(False)
    assert nothing.status_code == 400 and nothing.json()["error"]["param"] == "response_format", nothing.text
