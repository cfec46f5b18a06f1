"""Constrained decoding on the real default model through ``Engine.generate``: JSON-schema
outputs validate with ``jsonschema``, regex outputs ``re.fullmatch``, EBNF outputs parse with
``lark``, ``{"type": "object"}`` outputs ``json.loads`` to objects;
greedy output equals a decoder that masks with the brute-force reference matcher; the
same requests give the same output under a tight KV pool (retractions) and beside plain
requests, and plain requests are unchanged by constrained neighbours."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import lark
import pytest

from runtime.constrained.grammar_cache import GrammarCache
from runtime.constrained.reference import ReferenceRegexBackend
from runtime.constrained.spec import GrammarSpec

pytestmark = pytest.mark.slow

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                      "country": {"type": "string", "enum": ["France", "Japan", "Peru"]}},
     "required": ["city", "country"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]},
                                               "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "score": {"type": "integer", "minimum": 0, "maximum": 10}},
     "required": ["ok", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"person": {"type": "object", "properties": {
        "first": {"type": "string", "maxLength": 12}, "last": {"type": "string", "maxLength": 12}},
        "required": ["first", "last"], "additionalProperties": False},
        "year": {"type": "integer", "minimum": 1000, "maximum": 2100}}, "required": ["person", "year"], "additionalProperties": False},
    {"type": "object", "properties": {"steps": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}, "do": {"type": "string", "maxLength": 15}},
        "required": ["n", "do"], "additionalProperties": False}}}, "required": ["steps"], "additionalProperties": False},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000},
                                      "rating": {"type": "number", "minimum": 0, "maximum": 5}},
     "required": ["price", "rating"], "additionalProperties": False},
]
TOPICS = ["a famous scientist", "a city you like", "a colour palette", "a test result", "a novelist",
          "a cooking recipe", "a sports team", "a holiday trip", "a small company"]

REGEXES = [r"\(\d{3}\) \d{3}-\d{4}", r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", r"(yes|no|maybe)",
           r"[A-Z][a-z]{2,10}", r"#[0-9a-f]{6}", r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}"]
QUESTIONS = ["Give me a phone number.", "When did it happen?", "Will it rain?", "Name a fruit.",
             "Pick a colour.", "What is the server address?"]

# (question, xgrammar EBNF, the same language for lark, an independent parser)
EBNF_CASES = [
    ("Is the sky blue? Answer and explain in a few words.",
     'root ::= answer ", because " reason "."\nanswer ::= "yes" | "no"\nreason ::= [a-z]+ (" " [a-z]+)*',
     'start: ANSWER ", because " WORD (" " WORD)* "."\nANSWER: "yes" | "no"\nWORD: /[a-z]+/'),
    ("List a few fruits.",
     'root ::= "[" item (", " item)* "]"\nitem ::= [a-z]+',
     'start: "[" ITEM (", " ITEM)* "]"\nITEM: /[a-z]+/'),
    ("Write a sum of small numbers.",
     'root ::= term (op term)*\nop ::= " + " | " - "\nterm ::= [1-9] [0-9]?',
     'start: TERM (OP TERM)*\nOP: " + " | " - "\nTERM: /[1-9][0-9]?/'),
    ("Give settings as key=value pairs.",
     'root ::= pair ("; " pair)*\npair ::= [a-z]+ "=" [0-9]+',
     'start: PAIR ("; " PAIR)*\nPAIR: /[a-z]+=[0-9]+/'),
]


def _chat(engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}])


def test_json_schema_outputs_validate(engine):
    prompts, params = [], []
    for schema in SCHEMAS:
        for topic in TOPICS:
            prompts.append(_chat(engine, f"Describe {topic} as JSON."))
            params.append({"temperature": 0, "max_new_tokens": 120, "json_schema": json.dumps(schema)})
    assert len(prompts) >= 50
    outs = engine.generate(prompts, params)
    for out, p in zip(outs, params, strict=True):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), json.loads(p["json_schema"]))


def test_regex_outputs_fullmatch(engine):
    prompts, params = [], []
    for seed in range(4):  # sampled, so each seed is a different output
        for i, (question, regex) in enumerate(zip(QUESTIONS, REGEXES, strict=True)):
            prompts.append(_chat(engine, question))
            params.append({"temperature": 0.7, "seed": 10 * seed + i, "max_new_tokens": 40, "regex": regex})
    outs = engine.generate(prompts, params)
    for out, p in zip(outs, params, strict=True):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert re.fullmatch(p["regex"], out["text"]), (p, out["text"])


def test_ebnf_outputs_parse_with_the_grammar(engine):
    """Each output parses with lark (an independent parser) under the same language."""
    prompts, params, parsers = [], [], []
    for question, ebnf, lark_grammar in EBNF_CASES:
        for seed in range(3):
            prompts.append(_chat(engine, question))
            params.append({"temperature": 0.7, "seed": seed, "max_new_tokens": 48, "ebnf": ebnf})
            parsers.append(lark.Lark(lark_grammar))
    for out, parser in zip(engine.generate(prompts, params), parsers, strict=True):
        if out["meta_info"]["finish_reason"]["type"] == "stop":  # a length cut may end mid-rule
            parser.parse(out["text"])


def test_lark_grammars_on_llguidance_write_what_the_same_ebnf_writes_on_xgrammar(engine):
    """The same languages written in Lark (llguidance's dialect, as SGLang's llguidance backend
    takes them, with ``%llguidance``, and as vLLM does, without) in ``ebnf``: the two engines
    allow the same tokens at every step, so a seeded sample is the same text on both."""
    prompts, params, parsers = [], [], []
    for i, (question, ebnf, lark_grammar) in enumerate(EBNF_CASES):
        for seed, head in enumerate(("%llguidance {}\n", "")):
            for grammar in (ebnf, head + lark_grammar):
                prompts.append(_chat(engine, question))
                params.append({"temperature": 0.7, "seed": seed + i, "max_new_tokens": 48, "ebnf": grammar})
                parsers.append(lark.Lark(lark_grammar))
    outs = engine.generate(prompts, params)
    for on_xgrammar, on_llguidance in zip(outs[::2], outs[1::2], strict=True):
        assert on_llguidance["text"] == on_xgrammar["text"]
    for out, parser in zip(outs, parsers, strict=True):
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            parser.parse(out["text"])


def test_json_object_outputs_load(engine):
    prompts = [_chat(engine, f"Describe {topic} as a JSON object.") for topic in TOPICS]
    # Any object, as json_object asks; a few keys, or this small model keeps adding them.
    schema = '{"type": "object", "maxProperties": 4}'
    outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": 160, "json_schema": schema})
    done = [o for o in outs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    assert len(done) >= len(outs) // 2  # most objects close within the budget
    for out in done:
        obj = json.loads(out["text"])
        assert isinstance(obj, dict) and len(obj) <= 4


def test_stop_string_inside_a_constraint(engine):
    out = engine.generate(_chat(engine, "Count from one to nine."),
                          {"temperature": 0, "max_new_tokens": 40, "regex": r"[1-9](, [1-9])*", "stop": ", 4"})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ", 4"} or ", 4" not in out["text"]
    assert re.fullmatch(r"[1-9](, [1-9])*", out["text"]) and ", 4" not in out["text"]


def test_json_object_and_n_with_sampling(engine):
    outs = engine.generate(_chat(engine, "Give me a JSON object about cats."),
                           {"temperature": 1.0, "seed": 7, "n": 3, "max_new_tokens": 80,
                            "json_schema": json.dumps({"type": "object", "maxProperties": 3,
                                                       "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 99}})})
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert isinstance(json.loads(out["text"]), dict)


@pytest.fixture(scope="module")
def reference_backend(engine):
    return ReferenceRegexBackend.from_hf(engine.tokenizer.hf, engine.worker.model_config.vocab_size,
                                         engine.tokenizer.eos_token_ids)


def test_greedy_equals_the_brute_force_reference_decoder(engine, reference_backend):
    prompts = [_chat(engine, q) for q in QUESTIONS[:4]]
    params = [{"temperature": 0, "max_new_tokens": 16, "regex": r} for r in REGEXES[:4]]
    grammars = engine.scheduler.grammars
    fast_cache = grammars.cache
    engine.scheduler.jump_forward = False  # token for token: every token sampled
    try:
        want = engine.generate(prompts, params)
        grammars._cache = GrammarCache(reference_backend)
        got = engine.generate(prompts, params)
    finally:
        engine.scheduler.jump_forward = True
        if grammars._cache is not fast_cache:
            grammars._cache.shutdown()
        grammars._cache = fast_cache
    for g, w in zip(got, want, strict=True):
        assert g["output_ids"] == w["output_ids"]
        assert g["meta_info"]["finish_reason"] == w["meta_info"]["finish_reason"]


def test_retraction_and_plain_neighbours_change_nothing(model_dir, engine):
    from runtime.engine import Engine

    constrained = [_chat(engine, f"Describe {t} as JSON. " + "Be precise. " * 30) for t in TOPICS[:6]]
    c_params = [{"temperature": 0, "max_new_tokens": 60, "json_schema": json.dumps(SCHEMAS[i % 3])} for i in range(6)]
    plain = [_chat(engine, f"Tell me about {t}.") for t in TOPICS[:4]]
    p_params = [{"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}] * 4
    engine.flush_cache()
    alone = engine.generate(plain, p_params)
    want = engine.generate(constrained, c_params)
    mixed = engine.generate(constrained + plain, c_params + p_params)
    assert [o["output_ids"] for o in mixed] == [o["output_ids"] for o in want + alone]

    # Eight long prompts whose regex outlives max_new_tokens, in a pool that holds ~2 of them.
    # Which characters the regex allows depends on the position (a digit every sixth), so a
    # matcher state lost or reset by a retraction changes the output. (Character classes:
    # xgrammar fills their token masks from cache; ``([a-z]+ ){n}`` takes ~15 ms a request
    # and step.)
    long = [_chat(engine, f"Write story {i} about {TOPICS[i % 9]}. " + "Use many short words. " * 25) for i in range(8)]
    l_params = {"temperature": 0, "max_new_tokens": 30, "regex": r"([a-z ]{5}[0-9]){60}"}
    want_long = engine.generate(long, l_params)
    small = Engine(str(model_dir), dtype="float32", max_total_tokens=450, chunked_prefill_size=128)
    try:
        got = small.generate(long, l_params)
        assert small.scheduler.send_back.num_retractions > 0, "the pool was meant to be too small for all requests"
        small.scheduler.check_invariants()
    finally:
        small.shutdown()
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want_long]
    assert all(re.fullmatch(r"([a-z ]{5}[0-9])*[a-z ]{0,5}", o["text"]) for o in got)


def test_jump_forward_keeps_outputs_valid_in_fewer_steps(engine):
    props = {f"field_{k}": {"type": "integer", "minimum": 0, "maximum": 9} for k in range(10)}
    schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    prompts = [_chat(engine, f"Fill in form {i} as JSON.") for i in range(3)]
    params = {"temperature": 0, "max_new_tokens": 200, "json_schema": json.dumps(schema)}
    steps = {}
    for on in (False, True):
        engine.scheduler.jump_forward = on
        before = engine.core.stats()
        outs = engine.generate(prompts, params)
        after = engine.core.stats()
        steps[on] = after["num_forward_steps"] - before["num_forward_steps"]
        jumped = after["num_jumped_tokens"] - before["num_jumped_tokens"]
        assert (jumped > 0) == on
        for out in outs:
            assert out["meta_info"]["finish_reason"]["type"] == "stop"
            jsonschema.validate(json.loads(out["text"]), schema)
    assert steps[True] * 3 < steps[False], steps


def test_a_stop_token_inside_forced_text_stops_a_jumped_request_too(engine):
    """Jumped tokens are never checked against the stop rules: a jump now ends before a
    ``stop_token_ids`` entry, which is then sampled (and stops), as without jumps."""
    stop_id = engine.tokenizer.encode(" answer is", add_special_tokens=False)[0]
    prompt = _chat(engine, "Is the sky blue?")
    params = {"temperature": 0, "max_new_tokens": 20, "regex": r"The answer is (yes|no)\.", "stop_token_ids": [stop_id]}
    outs = {}
    for on in (False, True):
        engine.scheduler.jump_forward = on
        try:
            outs[on] = engine.generate(prompt, params)
        finally:
            engine.scheduler.jump_forward = True
    assert outs[False]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert outs[True]["output_ids"] == outs[False]["output_ids"]
    assert outs[True]["meta_info"]["finish_reason"] == outs[False]["meta_info"]["finish_reason"]


class _SlowBackend:
    """Delays every compile, to show other requests do not wait for it."""

    def __init__(self, inner, delay_s: float) -> None:
        self.inner, self.delay_s, self.vocab_size = inner, delay_s, inner.vocab_size

    def compile(self, spec: GrammarSpec):
        time.sleep(self.delay_s)
        return self.inner.compile(spec)


def test_a_compiling_grammar_blocks_no_one(engine):
    from runtime.sampling.params import SamplingParams
    from runtime.scheduler.req import Req

    grammars = engine.scheduler.grammars
    fast_cache = grammars.cache
    grammars._cache = GrammarCache(_SlowBackend(fast_cache.backend, 3.0))
    try:
        ids = engine.tokenizer.encode(_chat(engine, "Will it rain?"))
        slow = Req("slow", ids, SamplingParams(temperature=0, max_new_tokens=4, regex="(yes|no)"))
        quick = Req("quick", ids, SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True))
        dropped = Req("dropped", ids, SamplingParams(temperature=0, max_new_tokens=4, regex="(maybe|perhaps)"))
        for req in (slow, quick, dropped):
            engine.core.add_request(req)
        (out,) = engine.core.abort("dropped")  # still compiling: leaves the grammar queue at once
        assert out.finished and dropped.finished_reason["type"] == "abort" and len(engine.scheduler.grammars) == 1
        start = time.perf_counter()
        while not quick.is_finished:
            engine.core.step()
        assert time.perf_counter() - start < 2.5 and not slow.is_finished and slow.grammar is None
        while not slow.is_finished:
            engine.core.step()
        assert slow.output_ids and re.fullmatch("(yes|no)", engine.tokenizer.decode(slow.output_ids[:-1]))
    finally:
        grammars._cache.shutdown()
        grammars._cache = fast_cache


class _DelayedBackend:
    """Delays the compile of the specs whose text is in ``delays`` (seconds)."""

    def __init__(self, inner, delays: dict[str, float]) -> None:
        self.inner, self.delays, self.vocab_size = inner, delays, inner.vocab_size
        self.compiled: list[str] = []  # the specs' texts, as their compiles begin

    def compile(self, spec: GrammarSpec):
        self.compiled.append(spec.text)
        time.sleep(self.delays.get(spec.text, 0.0))
        return self.inner.compile(spec)


def test_a_compile_waiting_behind_a_slow_one_is_timed_from_its_own_start(engine, monkeypatch):
    """The timeout counts from a request's own compile: one queued behind a slow compile is
    not failed for that one's time (it was, counted from its arrival); a compile whose
    request was aborted before it began is cancelled, so the queue behind it moves on."""
    from runtime.sampling.params import SamplingParams
    from runtime.scheduler.req import Req

    grammars = engine.scheduler.grammars
    fast_cache = grammars.cache
    grammars._cache = GrammarCache(_DelayedBackend(fast_cache.backend, {"(a|b)": 1.0, "(c|d)": 1.0}))
    monkeypatch.setattr(grammars, "timeout_s", 0.7)
    try:
        ids = engine.tokenizer.encode(_chat(engine, "Pick one."))

        def req(rid: str, regex: str) -> Req:
            return Req(rid, ids, SamplingParams(temperature=0, max_new_tokens=4, regex=regex))

        slow, twin = req("slow", "(a|b)"), req("twin", "(a|b)")  # two samples of one request, say
        dropped, quick = req("dropped", "(c|d)"), req("quick", "(yes|no)")
        start = time.perf_counter()
        for r in (slow, twin, dropped, quick):
            engine.core.add_request(r)
        engine.core.abort("dropped")  # queued behind "slow": its 1 s compile never runs
        done_at = {}
        while engine.core.has_work:
            for out in engine.core.step():
                if out.finished:
                    done_at[out.req.rid] = time.perf_counter() - start
        assert slow.error is not None and "did not compile within 0.7 s" in slow.error  # its own 1 s
        assert twin.error == slow.error and abs(done_at["twin"] - done_at["slow"]) < 0.05  # together, one reason
        assert quick.error is None and re.fullmatch("(yes|no)", engine.tokenizer.decode(quick.output_ids[:-1]))
        assert done_at["quick"] < 1.8, done_at  # not behind the dropped compile too
        # a compile that runs past the timeout holds up the ones behind it for a timeout more at most
        grammars.cache.backend.delays["(e|f)"] = 2.0
        stuck, behind = req("stuck", "(e|f)"), req("behind", "(g|h)")
        for r in (stuck, behind):
            engine.core.add_request(r)
        while engine.core.has_work:
            engine.core.step()
        assert "did not compile within 0.7 s" in stuck.error
        assert "waited to compile behind another grammar that ran past 0.7 s" in behind.error
        while grammars.cache.busy_since() is not None:  # the stuck compile ends in its own time
            time.sleep(0.05)
        time.sleep(0.1)
        assert "(g|h)" not in grammars.cache.backend.compiled  # cancelled: nobody waited for it any more
        retry = req("retry", "(g|h)")  # nothing stale about its spec: it compiles and runs
        engine.core.add_request(retry)
        while engine.core.has_work:
            engine.core.step()
        assert retry.error is None and retry.output_ids
    finally:
        grammars._cache.shutdown()
        grammars._cache = fast_cache


def test_a_compile_past_the_timeout_fails_its_request_naming_the_field(engine, monkeypatch):
    """A grammar still compiling after --grammar-compile-timeout fails its request alone, with
    a message and field (``error_param``, the 400's ``param``) that say which constraint;
    the request beside it runs."""
    from runtime.sampling.params import SamplingParams
    from runtime.scheduler.req import Req

    grammars = engine.scheduler.grammars
    fast_cache = grammars.cache
    grammars._cache = GrammarCache(_SlowBackend(fast_cache.backend, 2.0))
    monkeypatch.setattr(grammars, "timeout_s", 0.3)
    try:
        ids = engine.tokenizer.encode(_chat(engine, "Give me an object."))
        late = Req("late", ids, SamplingParams(temperature=0, max_new_tokens=8, json_schema='{"type": "object"}'))
        plain = Req("plain", ids, SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True))
        engine.core.add_request(late)
        engine.core.add_request(plain)
        while engine.core.has_work:
            engine.core.step()
        assert late.finished_reason["type"] == "abort" and late.error_param == "json_schema"
        assert "did not compile within 0.3 s" in late.error and "--grammar-compile-timeout" in late.error
        assert len(plain.output_ids) == 3
        # alone, with nothing else to run: the failure is still reported, or its client waits for ever
        alone = Req("alone", ids, SamplingParams(temperature=0, max_new_tokens=8, json_schema='{"type": "array"}'))
        engine.core.add_request(alone)
        reported = []
        while engine.core.has_work:
            reported += [out.req for out in engine.core.step() if out.finished]
        assert reported == [alone] and alone.error_param == "json_schema"
    finally:
        grammars._cache.shutdown()
        grammars._cache = fast_cache
