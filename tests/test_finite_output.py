"""Grammars with a rule that can never end are found (``finite_output.unending_rules``) and
refused with a 400: xgrammar's jump-forward string of such a rule is endless, and one request
grew the scheduler to 22 GB until the system killed it. The verdicts are checked against
xgrammar itself: a grammar said to end accepts a finished string; one said not to never
terminates, whatever is fed."""

from __future__ import annotations

import json

import httpx
import pytest

from runtime.constrained.finite_output import unending_rules
from runtime.constrained.spec import GrammarSpec, check_spec
from runtime.sampling.params import InvalidField

xgr = pytest.importorskip("xgrammar")

SELF = {"$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}, "required": ["k"],
                        "additionalProperties": False}}, "$ref": "#/$defs/n"}
TREE = {"$defs": {"t": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                        "required": ["kids"], "additionalProperties": False}}, "$ref": "#/$defs/t"}

# (grammar, a string it accepts whole, or None where no string can end it)
CASES = [
    (xgr.Grammar.from_ebnf('root ::= "a" root'), None),
    (xgr.Grammar.from_ebnf('root ::= "x" | "y" loop\nloop ::= "a" loop'), "x"),  # ends, but one way never does
    (xgr.Grammar.from_ebnf('root ::= ("a" | "b")+ "c"?'), "abc"),
    (xgr.Grammar.from_ebnf('root ::= "(" root ")" | ""'), "(())"),
    (xgr.Grammar.from_json_schema(json.dumps(SELF), any_whitespace=False), None),
    (xgr.Grammar.from_json_schema(json.dumps(TREE), any_whitespace=False), '{"kids": [{"kids": []}]}'),
    (xgr.Grammar.builtin_json_grammar(), '{"a": [1, "b"]}'),
]


@pytest.mark.parametrize(("grammar", "finished"), CASES)
def test_unending_rules_agree_with_xgrammar(grammar, finished):
    unending = unending_rules(str(grammar))
    text = str(grammar)
    if finished is not None:
        assert xgr.testing._is_grammar_accept_string(grammar, finished)  # noqa: SLF001
    if "loop" in text:
        assert unending == ["loop"]  # reachable, and it can never end: refused too
    elif finished is None:
        assert "root" in unending
        assert not any(xgr.testing._is_grammar_accept_string(grammar, s)  # noqa: SLF001
                       for s in ("", "a" * 8, '{"k":{"k":{}}}', '{"k":null}'))
    else:
        assert unending == []


def test_text_it_cannot_read_gives_no_verdict():
    assert unending_rules("not a grammar") == [] and unending_rules('other ::= "a" other') == []


@pytest.mark.parametrize(("kind", "text"), [("ebnf", 'root ::= "a" root'), ("json_schema", json.dumps(SELF))])
def test_a_constraint_that_cannot_end_is_refused_naming_its_field(kind, text):
    with pytest.raises(InvalidField, match="allows no output that ends") as err:
        check_spec(GrammarSpec(kind, text))
    assert err.value.field == kind


@pytest.mark.slow
def test_the_server_refuses_it_and_keeps_serving(server):
    chat = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    for extra, param in (({"ebnf": 'root ::= "a" root'}, "ebnf"),
                         ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SELF}}},
                          "response_format")):
        r = httpx.post(server.url + "/v1/chat/completions", json={**chat, **extra}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "never end" in r.json()["error"]["message"]
    assert httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).status_code == 200
