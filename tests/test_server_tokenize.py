"""``/tokenize`` and ``/detokenize`` (and their ``/v1`` paths) against a real server, with the
generating routes as the oracle: a prompt's count is the ``prompt_tokens`` that
``/v1/completions`` reports for it, a chat's (messages and tools) the one the chat route
reports, and the ids decode back to the text; bad input is a 400 naming the field."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Oslo?"}]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


@pytest.mark.parametrize("v1", ["", "/v1"])
def test_a_prompt_counts_as_completions_count_it_and_decodes_back(server, v1):
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé too."
    out = post(server, f"{v1}/tokenize", {"model": MODEL, "prompt": text}).json()
    usage = post(server, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1}).json()["usage"]
    assert out["count"] == len(out["tokens"]) == usage["prompt_tokens"]
    assert out["max_model_len"] == httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["max_model_len"]
    back = post(server, f"{v1}/detokenize", {"model": MODEL, "tokens": out["tokens"]}).json()
    assert back == {"text": text, "prompt": text}


def test_a_chat_with_tools_counts_as_the_chat_route_counts_it(server):
    for tools in (None, [TOOL]):
        body = {"messages": CHAT, **({"tools": tools} if tools else {})}
        out = post(server, "/tokenize", body).json()
        usage = post(server, "/v1/chat/completions", {"model": MODEL, "max_tokens": 1, **body}).json()["usage"]
        assert out["count"] == usage["prompt_tokens"], tools
    with_tools, without = (post(server, "/tokenize", {"messages": CHAT, **extra}).json()["count"]
                           for extra in ({"tools": [TOOL]}, {}))
    assert with_tools > without + 20  # the tool's description is in the prompt


def test_lists_give_lists_and_token_strings_when_asked(server):
    texts = ["Hello", "Hello there, friend"]
    out = post(server, "/tokenize", {"prompt": texts, "return_token_strs": True}).json()
    assert out["count"] == [len(t) for t in out["tokens"]] and out["count"][0] < out["count"][1]
    assert [len(s) for s in out["token_strs"]] == out["count"]
    assert post(server, "/detokenize", {"tokens": out["tokens"]}).json()["text"] == texts
    one = post(server, "/tokenize", {"prompt": "Hello"}).json()
    assert one["tokens"] == out["tokens"][0] and "token_strs" not in one


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": "x", "messages": CHAT}, 400, "prompt"),
        ("/tokenize", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
        ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         400, "messages"),
        ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, path, body, status, param):
    resp = post(server, path, body)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["param"].split(".")[0] == param
