"""The grammar engine without the model: xgrammar against the brute-force reference on a
tiny vocabulary (the same allowed tokens at every step of random walks), the bitmask
helpers, the compile cache, and bad constraints refused naming the field."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.constrained.bitmask import allocate_bitmask, allowed_tokens, apply_bitmask, clear_bits
from runtime.constrained.grammar_cache import GrammarCache
from runtime.constrained.reference import ReferenceRegexBackend
from runtime.constrained.spec import GrammarSpec, check_constraint, spec_of
from runtime.constrained.xgrammar_backend import XGrammarBackend
from runtime.sampling.params import InvalidField, SamplingParams

# A tiny vocabulary: single characters, merges, a space token, and EOS last.
VOCAB = ["a", "b", "c", "ab", "bc", "abc", "0", "1", "2", "01", "12", "-", " ", "x", "{", "}", '"', ":", ","]
EOS = len(VOCAB)
REGEXES = [r"(ab)+c?", r"[0-2]{2,4}", r"a|bc|abc", r"-?[12][0-9]*", r"x( x)*", r"(a|b)*c", r"[abc]{3}"]


def _xgrammar_backend() -> XGrammarBackend:
    """The backend over the raw tiny vocabulary (it has no Hugging Face tokenizer)."""
    import xgrammar as xgr

    backend = XGrammarBackend.__new__(XGrammarBackend)
    backend.vocab_size = EOS + 1
    info = xgr.TokenizerInfo([*VOCAB, "</s>"], vocab_size=EOS + 1, stop_token_ids=[EOS])
    backend._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    return backend


@pytest.fixture(scope="module")
def backends():
    return _xgrammar_backend(), ReferenceRegexBackend([*VOCAB, None], EOS + 1, (EOS,))


def _allowed(matcher, vocab_size: int) -> set[int]:
    mask = allocate_bitmask(1, vocab_size)
    matcher.fill_bitmask(mask, 0)
    return set(allowed_tokens(mask[0], vocab_size).nonzero().flatten().tolist())


@settings(max_examples=80, deadline=None)
@given(pattern=st.sampled_from(REGEXES), choices=st.lists(st.integers(0, 10**6), min_size=12, max_size=12))
def test_xgrammar_allows_what_the_reference_allows(backends, pattern, choices):
    fast_backend, ref_backend = backends
    spec = GrammarSpec("regex", pattern)
    fast, ref = fast_backend.compile(spec).matcher(), ref_backend.compile(spec).matcher()
    for pick in choices:
        allowed = _allowed(ref, EOS + 1)
        assert _allowed(fast, EOS + 1) == allowed
        if not allowed:
            break
        token = sorted(allowed)[pick % len(allowed)]
        assert fast.accept_token(token) and ref.accept_token(token)
        assert fast.is_terminated() == ref.is_terminated() == (token == EOS)
        if token == EOS:
            assert _allowed(fast, EOS + 1) == set()
            break


def test_accept_refuses_a_disallowed_token_and_rollback_undoes(backends):
    for backend in backends:
        m = backend.compile(GrammarSpec("regex", r"ab+c")).matcher()
        assert not m.accept_token(VOCAB.index("c"))
        assert m.accept_token(VOCAB.index("ab")) and m.accept_token(VOCAB.index("bc"))
        assert _allowed(m, EOS + 1) == {EOS}
        m.rollback(1)
        assert VOCAB.index("c") in _allowed(m, EOS + 1)


def test_jump_forward_string_is_the_forced_text(backends):
    schema = json.dumps({"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]})
    m = backends[0].compile(GrammarSpec("json_schema", schema)).matcher()
    assert m.jump_forward_string().startswith('{"k"')


def test_bitmask_helpers():
    mask = allocate_bitmask(2, 70)
    assert mask.shape == (2, 3) and allowed_tokens(mask[0], 70).all()
    assert clear_bits(mask[0], [0, 31, 63, 69], 70)
    assert (~allowed_tokens(mask[0], 70)).nonzero().flatten().tolist() == [0, 31, 63, 69]
    logits = torch.zeros(2, 70)
    apply_bitmask(logits, mask)
    assert torch.isinf(logits[0]).sum() == 4 and not torch.isinf(logits[1]).any()
    only = torch.zeros(3, dtype=torch.int32)
    only[1] = 1  # token 32 alone
    assert not clear_bits(only, [32], 70) and allowed_tokens(only, 70).nonzero().flatten().tolist() == [32]
    only[2] = -1 << 6  # and the last word's bits past the vocabulary (tokens 70..95 do not exist)
    assert not clear_bits(only, [32], 70) and allowed_tokens(only, 70).nonzero().flatten().tolist() == [32]


def test_cache_compiles_once_and_forgets_failures(backends):
    cache = GrammarCache(backends[0], max_entries=2)
    a, b, c = (GrammarSpec("regex", p) for p in ("a+", "b+", "c+"))
    first = cache.get(a)
    assert first.result() is cache.get(a).result() and cache.num_compiles == 1
    cache.get(b).result()
    cache.get(c).result()  # evicts a, the least recently used
    assert cache.get(a).result() is not first.result() and cache.num_compiles == 4
    bad = GrammarSpec("ebnf", "root ::= ")
    with pytest.raises(ValueError, match="ebnf cannot be compiled"):
        cache.get(bad).result()
    cache.forget(bad)
    assert bad not in cache._entries
    cache.shutdown()


SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})


@pytest.mark.parametrize(
    ("fields", "name", "words"),
    [
        ({"regex": "[ab"}, "regex", "regex cannot be compiled"),
        ({"json_schema": "{not json"}, "json_schema", "not valid JSON"),
        ({"json_schema": "[1, 2]"}, "json_schema", "JSON object"),
        ({"json_schema": json.dumps({"type": "object", "properties": {"a": {"type": "strange"}}})}, "json_schema",
         "strange"),
        ({"ebnf": 'root ::= "a" |'}, "ebnf", "ebnf cannot be compiled"),
        ({"ebnf": 'start ::= "a"'}, "ebnf", "root"),
        ({"ebnf": '%llguidance {}\nstart: "a" b'}, "ebnf", "ebnf cannot be compiled: .*unknown name"),
        ({"ebnf": "yes or no"}, "ebnf", "read as Lark .it has no '::=' rule."),
        ({"regex": "a+", "json_schema": SCHEMA}, "json_schema", "at most one"),
    ],
)
def test_bad_constraints_are_refused_naming_the_field(fields, name, words):
    with pytest.raises(InvalidField, match=words) as err:
        check_constraint(SamplingParams.from_dict(fields))
    assert err.value.field == name


def test_spec_of_reads_the_one_constraint():
    assert spec_of(SamplingParams()) is None
    assert spec_of(SamplingParams.from_dict({"json_schema": {"type": "object"}})) == GrammarSpec(
        "json_schema", '{"type": "object"}'
    )
    check_constraint(SamplingParams.from_dict({"ebnf": 'root ::= "yes" | "no"'}))
    check_constraint(SamplingParams.from_dict({"ebnf": 'start: "yes" | "no"'}))
