"""Bad input gets the right status and an OpenAI-shaped error naming the problem, and the
server keeps serving afterwards."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


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
        ("/v1/chat/completions", {**CHAT, "max_tokenz": 3}, 400, ["max_tokenz", "xtra"], "max_tokenz"),
        ("/v1/chat/completions", {**CHAT, "messages": []}, 400, ["messages"], "messages"),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400, ["role"], "messages.0.role"),
        ("/v1/chat/completions", {**CHAT, "model": "gpt-9"}, 404, ["gpt-9"], "model"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 100_000}, 400, ["8192", "100", "maximum context length"], "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400, ["logprobs"], "top_logprobs"),
        ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400, ["tools", "not supported"], "tools"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, ["top_p"], None),
        ("/v1/completions", {"model": MODEL, "prompt": [[1, 2], [999_999]]}, 400, ["token ids"], "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": []}, 400, ["prompt"], None),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 50}, 400, ["logprobs"], "logprobs"),
        ("/generate", {"text": "a", "input_ids": [1]}, 400, ["exactly one"], "text"),
        ("/generate", {"input_ids": [5, -1]}, 400, ["token ids"], "input_ids"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_token": 3}}, 400, ["max_new_token"], None),
        ("/generate", {"text": "a", "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 2}}, 400, ["min_new_tokens"], None),
        ("/generate", {"text": "a", "sampling_params": {"regex": "[ab]+"}}, 400, ["not supported"], None),
        ("/generate", {"text": "a", "return_logprob": True, "logprob_start_len": -2}, 400, ["logprob_start_len", "-1"], "logprob_start_len"),
        ("/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": -1}, 400, ["top_logprobs_num"], "top_logprobs_num"),
        ("/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": 10**6}, 400, ["vocabulary"], "top_logprobs_num"),
        ("/generate", {"text": "a", "image_data": "x.png"}, 400, ["image_data", "not supported"], "image_data"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 10**6}}, 400, ["KV cache"], "max_tokens"),
    ],
)
def test_bad_input(server, path, body, status, words, param):
    assert_error(call(server, path, body), status, *words, param=param)


def test_prompt_beyond_context_names_the_numbers(server):
    long_ids = [100] * 8200
    resp = call(server, "/v1/completions", {"model": MODEL, "prompt": long_ids, "max_tokens": 1})
    assert_error(resp, 400, "8192", "8200", param="prompt")


def test_invalid_json_and_wrong_shape(server):
    assert_error(call(server, "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}), 400, "JSON")
    assert_error(call(server, "/generate", content=b"[1, 2]"), 400, "object")


def test_unknown_model_lookup_is_404(server):
    resp = httpx.get(server.url + "/v1/models/no-such-model")
    assert_error(resp, 404, "no-such-model")


def test_still_serving_after_errors(server):
    resp = call(server, "/generate", {"text": "Still alive?", "sampling_params": {"max_new_tokens": 2}})
    assert resp.status_code == 200 and resp.json()["meta_info"]["completion_tokens"] == 2
    assert server.info()["scheduler"]["kv_invariant_holds"] is True
