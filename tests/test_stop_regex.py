"""``stop_regex`` and stop strings without the model: the scheduler's bounded-tail check
finds a match on the same token as searching the whole output would (Python's ``re`` and
``in`` as the oracles; characters that take several byte-level tokens included), the
streamed text never shows a tail that may still become a match, and bad patterns are
refused naming the field."""

from __future__ import annotations

import os
import re

import pytest
import regex
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from runtime.detokenizer import visible_text
from runtime.sampling.params import InvalidField, SamplingParams
from runtime.sampling.stop_regex import held_from, tail_tokens
from runtime.scheduler.stop import check_stop

PATTERNS = [r"\d{2}", r"ab+c", r"END|STOP", r"x.y", r"[A-Z][a-z]{3}\b", r"\n\n", r"é\w", r"\bQuiz", r"(?<=a )\d"]


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def tok(model_dir):
    """The engine's own tokenizer (``output_text``, the detokenizer's decoding)."""
    from runtime.tokenizer import Tokenizer

    return Tokenizer(model_dir)


class _Req:
    """What ``check_stop`` reads of a request (and keeps on it from step to step)."""

    def __init__(self, params: SamplingParams, output_ids: list[int]) -> None:
        self.params, self.output_ids, self.input_ids = params, output_ids, [0]
        self.stop_text = None


def _first_stop_step(tokenizer, params: SamplingParams, ids: list[int]) -> int | None:
    """The step at which ``check_stop`` stops a request that generates ``ids``, one token
    per step as the scheduler calls it."""
    req = _Req(params, [])
    for k in range(1, len(ids) + 1):
        req.output_ids.append(ids[k - 1])
        if check_stop(req, (), 10**9, tokenizer.decode):
            return k
    return None


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(alphabet="abcxyENDSTOP0123456789 \nÉéAQuiz", min_size=1, max_size=60),
    patterns=st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=3, unique=True),
)
def test_bounded_tail_check_stops_where_a_full_search_would(tokenizer, text, patterns):
    ids = tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=10**6, stop_regex=patterns)
    expected = next(
        (
            k
            for k in range(1, len(ids) + 1)
            if any(re.search(p, tokenizer.decode(ids[:k])) for p in patterns)
        ),
        None,
    )
    assert _first_stop_step(tokenizer, params, ids) == expected


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="ab 🦙龘𝄞é\n", min_size=1, max_size=30), data=st.data())
def test_bounded_tail_check_finds_stop_strings_of_multi_token_characters(tokenizer, text, data):
    # 🦙, 龘 and 𝄞 take three byte-level tokens each in this tokenizer.
    ids = tokenizer.encode(text, add_special_tokens=False)
    start = data.draw(st.integers(0, len(text) - 1))
    stop = text[start : start + data.draw(st.integers(1, 3))]
    params = SamplingParams(max_new_tokens=10**6, stop=[stop])
    expected = next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k]))
    assert _first_stop_step(tokenizer, params, ids) == expected


def test_the_cut_after_min_new_tokens_holds_when_the_minimum_splits_a_character(model_dir):
    # "x龘y龘": 龘 is three byte-level tokens. The minimum falls inside the second 龘, so the
    # first one did not stop the request and the second did: the text is cut before it.
    from runtime.tokenizer import Tokenizer

    tok = Tokenizer(model_dir)
    ids = tok.hf.encode("x龘y龘", add_special_tokens=False)
    assert len(ids) == 8
    params = SamplingParams(max_new_tokens=10, min_new_tokens=7, stop=["龘"])  # ids[:6] ends inside it
    assert tok.output_text(ids, {"type": "stop", "matched": "龘"}, params) == "x龘y"


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(alphabet="ab 🦙龘\n", min_size=1, max_size=40),
    patterns=st.lists(st.sampled_from([r"a.+b", r"龘\s*🦙", r"\b🦙", r"b+\n", r"(?<=a)[^ab]{2}", r"^b"]),
                      min_size=1, max_size=3, unique=True),
    min_new=st.integers(0, 6),
)
def test_the_whole_output_check_stops_where_a_full_decode_would(tokenizer, text, patterns, min_new):
    """Unbounded or left-looking patterns keep the output's text from step to step
    (``req.stop_text``); they stop on the same token as decoding and searching the whole
    output each step, partial characters (three tokens each) and ``min_new_tokens`` (a
    match must end past the text the output had one token earlier) included."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=10**6, stop_regex=patterns, min_new_tokens=min_new)

    def stops(k: int) -> bool:
        now = tokenizer.decode(ids[:k])
        new_from = len(os.path.commonprefix([tokenizer.decode(ids[: k - 1]), now])) if min_new else 0
        return k >= min_new and any(m.end() > new_from for p in patterns for m in regex.finditer(p, now, overlapped=True))

    expected = next((k for k in range(1, len(ids) + 1) if stops(k)), None)
    assert _first_stop_step(tokenizer, params, ids) == expected


def test_the_whole_output_check_decodes_a_few_tokens_a_step(tokenizer):
    """It decoded the whole output at every step (quadratic in the output's length); now
    a step decodes a bounded number of tokens however long the output is."""
    ids = tokenizer.encode("The sum of the first numbers is computed step by step. " * 40, add_special_tokens=False)
    decoded: list[int] = []

    def decode(part: list[int]) -> str:
        decoded.append(len(part))
        return tokenizer.decode(part)

    req = _Req(SamplingParams(max_new_tokens=10**6, stop_regex=[r"\bQ\d+"]), [])
    for t in ids:
        req.output_ids.append(t)
        assert check_stop(req, (), 10**9, decode) is None
    assert len(ids) > 400 and max(decoded) <= 16


def test_unbounded_patterns_search_the_whole_output():
    assert tail_tokens([r"\d+"]) is None and tail_tokens([r"ab", r".*z"]) is None
    assert tail_tokens([r"ab", r"x{5}"]) == 4 * 5 + 2
    # what looks left of the match cannot be judged from a tail window's first character
    for looks_left in (r"\bAnswer:", r"^\d", r"(?m)^x", r"(?<=final answer is )\d", r"(x|(?:\Bq){2})", r"(?>a\b)"):
        assert tail_tokens([looks_left]) is None, looks_left
    assert tail_tokens([r"end$"]) == 4 * 3 + 2


@pytest.mark.parametrize(("pattern", "text"), [
    (r"\bAnswer:", "FinalAnswer: " + "the numbers add up to seven, and then we go on counting. " * 3),
    (r"^\d", "Step 1 computes the sum of the first seven numbers, then step 2 checks it. " * 2),
])
def test_an_anchored_pattern_does_not_stop_where_the_whole_output_has_no_match(tokenizer, pattern, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert not re.search(pattern, text)
    assert _first_stop_step(tokenizer, SamplingParams(max_new_tokens=10**6, stop_regex=[pattern]), ids) is None


def test_a_lookbehind_longer_than_the_window_still_stops(tokenizer):
    text = "So the final answer of the long computation is 7, as shown."
    ids = tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=10**6, stop_regex=[r"(?<=final answer of the long computation is )\d"])
    step = _first_stop_step(tokenizer, params, ids)
    assert step is not None and tokenizer.decode(ids[:step]).endswith("is 7")


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="abcxyz0123 ", max_size=30),
    pattern=st.sampled_from([r"ab+c", r"x\d\d", r"c z"]),
)
def test_streamed_text_never_shows_a_possible_match(text, pattern):
    """What the stream shows may not contain a match, and no continuation of the text can
    turn the shown part into one: it stops at the earliest full or partial match."""
    shown = visible_text(text, (), (pattern,))
    assert text.startswith(shown) and not re.search(pattern, shown)
    cut = held_from((pattern,), text)
    assert shown == text[:cut]
    # the held tail really can still complete: some extension of it matches from its start
    if cut < len(text):
        assert any(
            re.match(pattern, text[cut:] + tail) for tail in ("", "c", "bc", "0", "00", " z", "z")
        )


def test_visible_text_holds_the_earliest_of_strings_and_regexes():
    assert visible_text("answer: 4 EN", ("END",), (r"\d\d",)) == "answer: 4 "
    assert visible_text("answer: 4 EN", ("END",), (r"4",)) == "answer: "
    assert visible_text("answer: 4", (), ()) == "answer: 4"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("(", "not a valid regular expression"),
        ("a*", "empty string"),
        ("", "regular expression"),
        (["ok", 3], "regular"),
    ],
)
def test_bad_stop_regex_is_refused_naming_the_field(value, why):
    with pytest.raises(InvalidField, match=why) as err:
        SamplingParams.from_dict({"stop_regex": value})
    assert err.value.field == "stop_regex"


def test_stop_regex_string_becomes_a_list():
    assert SamplingParams.from_dict({"stop_regex": r"\d"}).stop_regex == [r"\d"]
    assert SamplingParams.from_dict({"stop_regex": None}).stop_regex == []


def _stream(tok, ids: list[int], params: SamplingParams) -> tuple[list[str], dict | None]:
    """Feed ``ids`` one per step through the scheduler's stop check and the detokenizer, as a
    streamed request goes: the text each update shows (the last: the finished text)."""
    import numpy as np

    from runtime.detokenizer import Detokenizer
    from runtime.ipc.messages import TokenUpdate

    detok, req, shown = Detokenizer(tok), _Req(params, []), []
    for t in ids:
        req.output_ids.append(t)
        finish = check_stop(req, (), 10**9, lambda part: tok.decode(part, skip_special_tokens=False))
        update = TokenUpdate("r", 1, finish, 1, 0, len(req.output_ids), params.skip_special_tokens, tuple(params.stop),
                             tuple(params.stop_regex), params.no_stop_trim, params.min_new_tokens)
        shown.append(detok.text_of(update, np.array([t])))
        if finish is not None:
            return shown, finish
    return shown, None


@pytest.mark.parametrize("kind", ["stop", "stop_regex"])
@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.one_of(st.text(alphabet="ab\n", min_size=1, max_size=3), st.sampled_from(["<S>", "<E>"])),
                       min_size=2, max_size=12), data=st.data())
def test_the_finished_text_keeps_what_was_streamed_when_special_tokens_hide_a_match(tok, kind, pieces, data):
    # The scheduler finds stop strings in the text with special tokens; the answer skips them,
    # so it can hold a match the scheduler never saw ("x<|im_end|>\n<|im_start|>user" shows
    # "x\nuser"). That text was streamed; the cut must not take it back.
    special = {"<S>": tok.hf.convert_tokens_to_ids("<|im_start|>"), "<E>": tok.hf.convert_tokens_to_ids("<|im_end|>")}
    ids = [i for p in pieces for i in ([special[p]] if p in special else tok.hf.encode(p, add_special_tokens=False))]
    visible = tok.decode(ids)
    if not visible:
        return
    start = data.draw(st.integers(0, len(visible) - 1))
    stop = visible[start : start + data.draw(st.integers(2, 3))]
    rule = {"stop": [stop]} if kind == "stop" else {"stop_regex": [re.escape(stop)]}
    shown, finish = _stream(tok, ids, SamplingParams(max_new_tokens=10**6, ignore_eos=True, **rule))
    assert all(shown[-1].startswith(earlier) for earlier in shown[:-1]), (shown, finish)


@pytest.mark.parametrize("rule", [{"stop": ["\nuser"]}, {"stop_regex": [r"\nuser"]}, {"stop_regex": [r"\nuse(?=r)"]}])
def test_a_stop_string_hidden_by_special_tokens_is_not_where_the_text_is_cut(tok, rule):
    start, end = tok.hf.convert_tokens_to_ids("<|im_start|>"), tok.hf.convert_tokens_to_ids("<|im_end|>")
    e = lambda text: tok.hf.encode(text, add_special_tokens=False)  # noqa: E731
    ids = e("Paris.") + [end] + e("\n") + [start] + e("user\nAnd Spain?") + [end] + e("\nassistant\nMadrid.\nuser")
    shown, finish = _stream(tok, ids, SamplingParams(max_new_tokens=100, ignore_eos=True, **rule))
    assert finish == {"type": "stop", "matched": next(iter(rule.values()))[0]} and len(shown) == len(ids)
    assert shown[-1] == "Paris.\nuser\nAnd Spain?\nassistant\nMadrid."



@settings(max_examples=60, deadline=None)
@example(text=" omega", stops=["a", "e"])  # one token holds both: " omeg" held "e"
@given(text=st.text(alphabet="abcde omg\n", min_size=1, max_size=40),
       stops=st.lists(st.text(alphabet="abcde omg", min_size=1, max_size=3), min_size=2, max_size=4, unique=True))
@pytest.mark.parametrize("include", [False, True])
def test_several_stop_strings_cut_at_the_first_in_the_text(tok, text, stops, include):
    """Whatever their order in the list: the answer is cut where the first stop string in
    the text begins (it holds none of them), as OpenAI's are; Python's ``find`` the oracle.
    With vLLM's ``include_stop_str_in_output`` it ends with that stop string, not with the
    rest of the token that held it (SGLang's ``no_stop_trim`` keeps that)."""
    ids = tok.hf.encode(text, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=10**6, stop=stops, include_stop_str_in_output=include)
    req = _Req(params, [])
    for token in ids:
        req.output_ids.append(token)
        if (reason := check_stop(req, (), 10**9, tok.hf.decode)) is not None:
            break
    seen = tok.hf.decode(req.output_ids)
    starts = [at for s in stops if (at := seen.find(s)) >= 0]
    if reason is None:
        assert not starts
    else:
        got = tok.output_text(req.output_ids, reason, params)
        if include:
            assert got == seen[:min(starts)] + reason["matched"], (seen, stops, reason)
        else:
            assert got == seen[:min(starts)] and not any(s in got for s in stops), (seen, stops, reason)


def test_include_stop_str_in_output_ends_with_the_regex_match_or_the_stop_token(tok):
    ids = tok.hf.encode(" omega", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=99, stop_regex=["m.g"], include_stop_str_in_output=True)
    req = _Req(params, list(ids))
    reason = check_stop(req, (), 10**9, tok.hf.decode)
    assert tok.output_text(req.output_ids, reason, params) == " omeg"
    end = tok.hf.convert_tokens_to_ids("<|im_end|>")
    for include, want in ((False, " omega"), (True, " omega<|im_end|>")):
        params = SamplingParams(stop_token_ids=[end], skip_special_tokens=False, include_stop_str_in_output=include)
        assert tok.output_text([*ids, end], {"type": "stop", "matched": end}, params) == want


def test_a_stop_regex_that_starts_before_a_stop_string_wins(tok):
    """One token (" omega") completes both: the match that starts first cuts the answer."""
    ids = tok.hf.encode(" omega", add_special_tokens=False)
    for params, cut in ((SamplingParams(max_new_tokens=99, stop=["a"], stop_regex=["e"]), " om"),
                        (SamplingParams(max_new_tokens=99, stop=["e"], stop_regex=["g+a"]), " om"),
                        (SamplingParams(max_new_tokens=99, stop=["ga"], stop_regex=["a$"]), " ome")):
        req = _Req(params, list(ids))
        reason = check_stop(req, (), 10**9, tok.hf.decode)
        assert tok.output_text(req.output_ids, reason, params) == cut, (params, reason)


def test_a_pattern_that_backtracks_for_ever_ends_its_request_not_the_step(tokenizer):
    """``(.*){1,32000}x`` on a few dozen characters searched for minutes inside a step, which
    stalled every request on the server: the search has a time limit, and the request alone
    ends, with an error naming stop_regex."""
    import time

    pattern = "(.*){1,32000}[\x00\x01]"
    text = "Tell me about the sea, the waves and the wind."
    ids = tokenizer.encode(text, add_special_tokens=False)
    req = _Req(SamplingParams(max_new_tokens=10**6, stop_regex=[pattern]), list(ids))
    started = time.perf_counter()
    reason = check_stop(req, (), 10**9, tokenizer.decode)
    assert reason is not None and reason["type"] == "abort" and "stop_regex" in req.error
    assert req.error_param == "stop_regex"
    assert held_from((pattern,), text) == len(text)  # streaming shows the text; the request ends anyway
    assert time.perf_counter() - started < 5
