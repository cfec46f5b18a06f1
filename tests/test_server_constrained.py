"""Constrained output over HTTP: OpenAI's ``response_format`` through the official client
(``parse`` with a pydantic model, ``json_object``, streaming), the ``regex`` / ``ebnf`` extra
fields, native ``/generate`` constraints equal to the offline engine's, and bad
constraints answered 400 naming the field while the server keeps serving."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


class City(BaseModel):
    name: str = Field(max_length=20)
    country: Literal["France", "Japan", "Peru"]
    population_millions: int = Field(ge=0, le=50)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_parse_with_a_pydantic_model(client):
    resp = client.chat.completions.parse(
        model=MODEL, temperature=0, max_tokens=60, response_format=City,
        messages=[{"role": "user", "content": "Describe a big city as JSON."}],
    )
    city = resp.choices[0].message.parsed
    assert isinstance(city, City) and resp.choices[0].finish_reason == "stop"


class Invoice(BaseModel):
    amount: Decimal  # a string pattern with a look-ahead: no grammar engine here keeps it
    tags: set[str] = Field(max_length=3)  # uniqueItems: neither does llguidance


def test_a_schema_without_strict_is_kept_as_far_as_it_can_be(client):
    """OpenAI's ``strict`` false (or absent) promises best effort: instructor's JSON_SCHEMA
    mode and pydantic-ai's NativeOutput got a 400 for a Decimal or a set. The part xgrammar
    enforces is kept (as for a tool without strict); with strict it is still the 400."""
    schema = Invoice.model_json_schema()
    messages = [{"role": "user", "content": "Write an invoice as JSON."}]
    for strict in (False, None):
        json_schema = {"name": "invoice", "schema": schema, **({} if strict is None else {"strict": strict})}
        resp = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=80, messages=messages,
                                              response_format={"type": "json_schema", "json_schema": json_schema})
        choice = resp.choices[0]
        if choice.finish_reason == "stop":
            answer = json.loads(choice.message.content)
            assert set(answer) == {"amount", "tags"} and isinstance(answer["tags"], list)
        r = client.responses.create(model=MODEL, input="Write an invoice as JSON.", max_output_tokens=80, temperature=0,
                                    text={"format": {"type": "json_schema", "name": "invoice", "schema": schema,
                                                     **({} if strict is None else {"strict": strict})}})
        assert r.status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError, match="cannot be enforced"):
        client.chat.completions.create(model=MODEL, max_tokens=8, messages=messages, response_format={
            "type": "json_schema", "json_schema": {"name": "invoice", "schema": schema, "strict": True}})


def test_json_object_streamed_and_not(client):
    kw = dict(model=MODEL, temperature=0, max_tokens=120, response_format={"type": "json_object"},
              messages=[{"role": "user", "content": 'Give me a JSON object with keys "name" and "age" for a dog.'}])
    whole = client.chat.completions.create(**kw).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    assert "".join(parts) == whole
    assert isinstance(json.loads(whole), dict)


def test_regex_and_ebnf_extra_fields(client):
    resp = client.completions.create(model=MODEL, prompt="The year the war ended:", max_tokens=10, temperature=0,
                                     extra_body={"regex": r" (19|20)\d\d"})
    assert re.fullmatch(r" (19|20)\d\d", resp.choices[0].text)
    resp = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=10, messages=[{"role": "user", "content": "Is water wet?"}],
        extra_body={"ebnf": 'root ::= "Yes." | "No."'},
    )
    assert resp.choices[0].message.content in ("Yes.", "No.")


def test_native_generate_equals_offline_engine(server, engine):
    body = {"text": "A JSON object describing a cat:", "sampling_params": {
        "temperature": 0, "max_new_tokens": 50, "json_schema": {"type": "object", "maxProperties": 2}}}
    got = httpx.post(server.url + "/generate", json=body, timeout=120).json()
    want = engine.generate(body["text"], body["sampling_params"])
    assert got["output_ids"] == want["output_ids"] and got["text"] == want["text"]


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/generate", {"text": "a", "sampling_params": {"json_schema": "{oops"}}, "json_schema", "not valid JSON"),
        ("/generate", {"text": "a", "sampling_params": {"json_schema": json.dumps(
            {"type": "object", "properties": {"a": {"type": "strange"}}})}}, "json_schema", "strange"),
        ("/generate", {"text": "a", "sampling_params": {"ebnf": 'root ::= "a" |'}}, "ebnf", "ebnf cannot be compiled"),
        ("/generate", {"text": "a", "sampling_params": {"regex": "a+", "json_schema": "{}"}}, "json_schema", "at most one"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "regex": "(a"},
         "regex", "regex cannot be compiled"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                  "response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                  "response_format": {"type": "xml"}}, "response_format.type", "json_object"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "regex": "a", "response_format": {"type": "json_object"}},
         "response_format", "at most one"),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(server, path, body, param, words):
    resp = httpx.post(server.url + path, json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
