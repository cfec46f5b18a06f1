"""The grammars that enforce tool calls (``runtime/server/tools/constraint.py``), checked
against hand-written outputs for every format: which texts each ``tool_choice`` and
``parallel_tool_calls`` setting (``allowed_tools`` included) lets the model write, and which
it does not; and how each ``tool_choice`` form is read. Each accepted
text also parses back into the same calls with the format's parser. Every rule is checked on
both grammars the server writes: xgrammar's EBNF and llguidance's Lark (``call_lark.py``,
used where a schema has a part xgrammar would not enforce)."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from runtime.sampling.params import InvalidField
from runtime.server.tools.choice import CallRule, call_rule
from runtime.server.tools.constraint import tool_grammar as _tool_grammar
from runtime.server.tools.parsers import get_parser


@pytest.fixture(params=["xgrammar", "llguidance"])
def tool_grammar(request):
    return lambda *args, **kwargs: _tool_grammar(*args, lark=request.param == "llguidance", **kwargs)


@pytest.fixture(scope="module")
def llguidance_tokenizer(model_dir):
    import llguidance.hf

    from runtime.tokenizer import load_hf_tokenizer

    hf = load_hf_tokenizer(model_dir)
    return hf, llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=[hf.eos_token_id])


@pytest.fixture
def accepts(llguidance_tokenizer):
    """Whether ``grammar`` (either engine's) takes ``text`` whole."""
    import llguidance

    hf, tokenizer = llguidance_tokenizer

    def check(grammar: str, text: str) -> bool:
        if not grammar.startswith("%llguidance"):
            return xgr.testing._is_grammar_accept_string(grammar, text)
        matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
        for token in hf.encode(text, add_special_tokens=False):
            if matcher.validate_tokens([token]) != 1:
                return False
            matcher.consume_token(token)
        return matcher.is_accepting()

    return check

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
WEATHER, ADD = ("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})


def block(fmt: str, calls: list[tuple[str, dict]]) -> str:
    """A format's way of writing ``calls`` together, as its models write them."""
    if fmt in ("hermes", "qwen25"):
        return "\n".join(f'<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a)}}}\n</tool_call>' for n, a in calls)
    if fmt == "llama3_json":
        return "; ".join(f'{{"name": "{n}", "parameters": {json.dumps(a)}}}' for n, a in calls)
    return "[TOOL_CALLS] [" + ", ".join(f'{{"name": "{n}", "arguments": {json.dumps(a)}}}' for n, a in calls) + "]"


@pytest.mark.parametrize("fmt", ["hermes", "qwen25", "llama3_json", "mistral"])
@pytest.mark.parametrize("parallel", [True, False])
def test_required_allows_only_calls_and_parallel_allows_several(fmt, parallel, tool_grammar, accepts):
    grammar = tool_grammar(TOOLS, "required", fmt, parallel)
    one, two = block(fmt, [WEATHER]), block(fmt, [WEATHER, ADD])
    assert accepts(grammar, one)
    assert accepts(grammar, two) == parallel
    assert not accepts(grammar, "The weather is nice.")
    assert not accepts(grammar, "Sure. " + one)
    assert not accepts(grammar, block(fmt, [("get_weather", {"town": "Paris"})]))  # not the tool's schema
    assert not accepts(grammar, block(fmt, [("get_time", {})]))  # not a declared tool
    for text, calls in ((one, [WEATHER]), (two, [WEATHER, ADD])):
        if accepts(grammar, text):
            _, parsed = get_parser(fmt).parse(text)
            assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
@pytest.mark.parametrize("parallel", [True, False])
def test_a_named_function_allows_exactly_one_call_of_it(fmt, parallel, tool_grammar, accepts):
    # OpenAI's forced function: "call exactly one specific function", parallel or not.
    grammar = tool_grammar(TOOLS, {"type": "function", "function": {"name": "add"}}, fmt, parallel)
    assert accepts(grammar, block(fmt, [ADD]))
    assert not accepts(grammar, block(fmt, [WEATHER]))
    assert not accepts(grammar, block(fmt, [ADD, ADD]))


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_allows_text_and_valid_calls_and_stops_after_one_unless_parallel(parallel, tool_grammar, accepts):
    grammar = tool_grammar(TOOLS, "auto", "hermes", parallel)
    call, other = block("hermes", [WEATHER]), block("hermes", [ADD])
    assert accepts(grammar, "It is sunny in Paris today.")
    assert accepts(grammar, "Let me check. " + call)
    assert accepts(grammar, call + "\n" + other) == parallel
    assert not accepts(grammar, '<tool_call>\n{"name": "get_weather", "arguments": {"town": "x"}}\n</tool_call>')


def test_none_enforces_nothing(tool_grammar):
    assert tool_grammar(TOOLS, "none", "hermes") is None


@pytest.mark.parametrize("fmt", ["hermes", "qwen25", "llama3_json", "mistral"])
def test_auto_with_an_answer_schema_allows_calls_or_that_json_only(fmt, tool_grammar, accepts):
    """tools + a JSON response_format (the Agents SDK's structured output beside tools): the
    answer either calls tools or is one value of the schema, never free text."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}
    grammar = tool_grammar(TOOLS, "auto", fmt, answer_schema=schema)
    assert accepts(grammar, block(fmt, [WEATHER]))
    assert accepts(grammar, block(fmt, [WEATHER, ADD]))
    assert accepts(grammar, '{"answer": "sunny"}')
    assert not accepts(grammar, '{"answer": 3}')
    assert not accepts(grammar, "It is sunny.")
    # a forced call stays a call: the schema is for the answer that follows the tools' results
    assert not accepts(tool_grammar(TOOLS, "required", fmt, answer_schema=schema), '{"answer": "sunny"}')


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
def test_allowed_tools_limits_the_calls_to_those_tools(fmt, tool_grammar, accepts):
    """allowed_tools: every tool stays in the prompt, only the listed ones may be called;
    mode ``required`` is calls only, ``auto`` also free text."""
    only_add = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "add"}}]}}
    required = tool_grammar(TOOLS, only_add, fmt)
    assert accepts(required, block(fmt, [ADD]))
    assert accepts(required, block(fmt, [ADD, ADD]))
    assert not accepts(required, block(fmt, [WEATHER]))
    assert not accepts(required, block(fmt, [ADD, WEATHER]))
    assert not accepts(required, "I will not call anything.")
    auto = tool_grammar(TOOLS, {**only_add, "allowed_tools": {**only_add["allowed_tools"], "mode": "auto"}}, fmt)
    assert accepts(auto, "I will not call anything.")
    if fmt == "hermes":  # a call inside free text opens at the format's trigger
        assert accepts(auto, "Adding. " + block(fmt, [ADD]))
        assert not accepts(auto, "Checking. " + block(fmt, [WEATHER]))


@pytest.mark.parametrize(
    ("tools", "choice", "words"),
    [
        (None, "required", "needs 'tools'"),
        (TOOLS, "sometimes", "must be one of"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "names 'nope', which is not one of the given tools"),
        (TOOLS, {"type": "allowed_tools", "allowed_tools": {"mode": "sometimes", "tools": [
            {"type": "function", "function": {"name": "add"}}]}}, 'needs "mode"'),
        (TOOLS, {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, "non-empty"),
        (TOOLS, {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
            {"type": "function", "function": {"name": "nope"}}]}}, "'nope', which is not one of the given"),
        (TOOLS, {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
            {"type": "function", "name": "add"}]}}, "each of allowed_tools.tools must be"),
        (TOOLS, {"type": "custom", "custom": {"name": "add"}}, "must be one of"),
    ],
)
def test_a_tool_choice_the_request_cannot_honour_names_the_field(tools, choice, words):
    with pytest.raises(InvalidField, match=words) as err:
        call_rule(tools, choice)
    assert err.value.field == "tool_choice"


def test_the_call_rule_of_each_form():
    names = ("get_weather", "add")
    assert call_rule(TOOLS, None) == CallRule("auto", names)
    assert call_rule(None, None) == CallRule("none", ())
    assert call_rule(None, "auto") == call_rule([], "auto") == CallRule("none", ())  # nothing to call
    assert call_rule(TOOLS, "none") == CallRule("none", names)
    assert call_rule(TOOLS, {"type": "function", "function": {"name": "add"}}) == CallRule("required", ("add",), single=True)
    both = [{"type": "function", "function": {"name": n}} for n in ("add", "get_weather")]
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": both}}
    assert call_rule(TOOLS, allowed) == CallRule("auto", names)  # in the request's order


# A strict tool whose schema has parts xgrammar would let through unenforced (a URL with a
# length, as pydantic's HttpUrl writes it; a pattern with a length): the request's call
# grammar is llguidance's, which keeps them.
STRICT_TOOLS = [
    {"type": "function", "function": {"name": "fetch", "strict": True, "parameters": {
        "type": "object", "additionalProperties": False, "required": ["url", "tag"], "properties": {
            "url": {"type": "string", "format": "uri", "minLength": 1, "maxLength": 24},
            "tag": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}}}}},
    # not strict, with a format neither engine checks (an annotation): left out, not refused
    {"type": "function", "function": {"name": "save", "parameters": {
        "type": "object", "properties": {"blob": {"type": "string", "format": "binary"}}, "required": ["blob"]}}},
]
FETCH = ("fetch", {"url": "https://a.io/x", "tag": "news"})


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
def test_a_strict_schema_xgrammar_would_not_keep_is_enforced_by_llguidance(fmt, accepts):
    required = _tool_grammar(STRICT_TOOLS, "required", fmt)
    assert required.startswith("%llguidance")
    assert accepts(required, block(fmt, [FETCH]))
    assert accepts(required, block(fmt, [FETCH, ("save", {"blob": "AAEC"})]))
    for bad in ({"url": "https://a.io/" + "x" * 20, "tag": "news"},  # beyond maxLength
                {"url": "not a url", "tag": "news"}, {"url": "https://a.io", "tag": "Upper"},
                {"url": "https://a.io", "tag": "toolong"}):
        assert not accepts(required, block(fmt, [("fetch", bad)])), bad
    auto = _tool_grammar(STRICT_TOOLS, "auto", fmt)
    assert accepts(auto, "No call needed.")
    if fmt == "hermes":
        assert accepts(auto, "Fetching. " + block(fmt, [FETCH]))
        assert not accepts(auto, "Fetching. " + block(fmt, [("fetch", {"url": "https://a.io", "tag": "toolong"})]))


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json"])
def test_an_answer_schema_xgrammar_would_not_keep_is_enforced_beside_the_calls(fmt, accepts):
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$", "maxLength": 3}},
              "required": ["code"]}
    grammar = _tool_grammar(TOOLS, "auto", fmt, answer_schema=schema)
    assert grammar.startswith("%llguidance")
    assert accepts(grammar, '{"code": "ABC"}')
    assert not accepts(grammar, '{"code": "ABCD"}')
    assert accepts(grammar, block(fmt, [WEATHER, ADD]))  # llama3_json: the calls are JSON objects too


def test_a_strict_schema_neither_engine_keeps_is_refused_naming_the_tool():
    tool = {"type": "function", "function": {"name": "tag", "strict": True, "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}}}
    with pytest.raises(InvalidField, match="strict tool 'tag' cannot be enforced.*uniqueItems.*without 'strict'") as err:
        _tool_grammar([tool, *STRICT_TOOLS], "auto", "hermes")
    assert err.value.field == "tools"


def _one_tool(strict: bool, pattern: str) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "strict": strict, "parameters": {
        "type": "object", "properties": {"u": {"type": "string", "pattern": pattern, "maxLength": 5}}}}}]


def test_a_broken_pattern_is_a_compile_error_and_the_strict_hint_only_where_it_holds():
    """An invalid pattern is the schema's own error, strict or not (it used to be reported as
    llguidance's refusal of pattern + maxLength, with a hint that dropping strict would help);
    look-around is kept by neither engine: strict, a 400 whose hint holds, as without strict
    the calls follow the rest (the pattern and the length both taken out)."""
    for strict in (True, False):
        with pytest.raises(InvalidField, match=r"cannot be compiled: .*Unclosed '\['$"):
            _tool_grammar(_one_tool(strict, "[a-"), "required", "hermes")
    with pytest.raises(InvalidField, match="cannot be enforced: .*look-around.*without 'strict' its calls follow"):
        _tool_grammar(_one_tool(True, "^(?=a)a+$"), "required", "hermes")
    assert not _tool_grammar(_one_tool(False, "^(?=a)a+$"), "required", "hermes").startswith("%llguidance")
