"""Tool-call parsers on hand-written model outputs (no model): calls and content split
right for each format, bad markup stays content, and streaming gives the same calls and
content as parsing the whole text while never showing markup."""

from __future__ import annotations

import json

import pytest

from runtime.server.chat_answer import ChatAnswer
from runtime.server.tools.parsers import StreamingToolParser, get_parser, parser_for_template

CASES = {
    "hermes": ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'),
    "qwen25": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "add", "parameters": {"a": 1, "b": 2}}',
    "mistral": 'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {"a": 1, "b": 2}}]',
}
CONTENT = {"hermes": "Let me check.", "qwen25": "", "llama3_json": "", "mistral": "Sure."}


@pytest.mark.parametrize("name", list(CASES))
def test_calls_and_content_are_split(name):
    content, calls = get_parser(name).parse(CASES[name])
    assert content == CONTENT[name]
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    if name != "qwen25":
        assert calls[1].name == "add" and json.loads(calls[1].arguments) == {"a": 1, "b": 2}
    assert all(c.as_openai()["id"].startswith("call_") for c in calls)


@pytest.mark.parametrize("name", list(CASES))
def test_plain_text_and_broken_markup_stay_content(name):
    parser = get_parser(name)
    assert parser.parse("Just an answer.") == ("Just an answer.", [])
    broken = parser.start + ' {"name": "f", "arguments": '
    assert parser.parse(broken) == (broken, [])


@pytest.mark.parametrize(("name", "text"), [
    ("hermes", "Wrap your calls in <tool_call> tags, like this."),
    ("llama3_json", '{"city": "Paris", "temperature": 18}'),  # an answer in JSON, not a call
    ("mistral", "Write [TOOL_CALLS] before the list."),
])
def test_streamed_markup_that_never_parses_ends_as_content(name, text):
    stream = StreamingToolParser(get_parser(name))
    content, calls = "", []
    for end in range(1, len(text) + 1):
        delta, new_calls = stream.feed(text[:end], finished=end == len(text))
        content, calls = content + delta, calls + new_calls
    assert (content, calls) == (text, []) == get_parser(name).parse(text)


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
def test_a_last_call_cut_off_is_dropped_and_the_whole_ones_stand(name):
    """max_tokens may end an answer inside its second call: the first is returned, no markup
    reaches the content; a cut-off first call is no call at all (the text stays content)."""
    text = CASES[name]
    cut = text[: text.index('"add"') + 12]  # inside the second call's arguments
    content, calls = get_parser(name).parse(cut)
    assert [c.name for c in calls] == ["get_weather"]
    assert content == CONTENT[name]
    first_only = text[: text.index('"get_weather"') + 20]
    assert get_parser(name).parse(first_only) == (first_only, [])


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
def test_an_answer_cut_off_inside_its_first_call_drops_it_streamed_or_not(name):
    """The grammar lets nothing but a call follow the markup, so markup cut off by max_tokens
    is an unfinished call, not text: the answer keeps its content before it, whole or
    streamed (with a finish other than length, markup that never parses stays content)."""
    text = CASES[name]
    cut = text[: text.index('"get_weather"') + 8]  # inside the first call's name
    for end in (cut, text[: text.index('"get_weather"') + 20]):  # ... and inside its arguments
        message, finish = ChatAnswer(get_parser(name), None).message(end, "length")
        assert finish == "length" and "tool_calls" not in message
        assert message["content"] == (CONTENT[name] or None)
        streamed, calls = _streamed_answer(name, end, "length")
        assert streamed == CONTENT[name]
        assert all(call_name == "get_weather" for call_name, _ in calls)  # as far as it was announced
    json_answer = '{"city": "Paris", "temper'  # JSON content (a response_format answer), not a call
    assert ChatAnswer(get_parser("llama3_json"), None).message(json_answer, "length")[0]["content"] == json_answer


@pytest.mark.parametrize("name", ["hermes", "mistral", "llama3_json"])
def test_streaming_matches_whole_parse_and_hides_markup(name):
    """Fed a character at a time: the content and the calls equal the whole parse; each call
    starts with one delta carrying index, id, type and name, then its arguments arrive in
    fragments while they are written (before the call's markup closes), adding up to the
    same string as the whole parse's."""
    text = CASES[name]
    stream = StreamingToolParser(get_parser(name))
    content, deltas = "", []
    for end in range(1, len(text) + 1):
        delta, new_calls = stream.feed(text[:end], finished=end == len(text))
        content += delta
        deltas += [(end, d) for d in new_calls]
        assert "<tool" not in content and "[TOOL" not in content and "python_tag" not in content
    want_content, want_calls = get_parser(name).parse(text)
    assert content == want_content
    heads = [d for _, d in deltas if "id" in d]
    assert [h["function"]["name"] for h in heads] == [c.name for c in want_calls]
    assert all(h["type"] == "function" and h["function"]["arguments"] == "" for h in heads)
    assert [h["index"] for h in heads] == list(range(len(want_calls)))
    for i, call in enumerate(want_calls):
        fragments = [(end, d["function"]["arguments"]) for end, d in deltas if d["index"] == i and "id" not in d]
        assert "".join(f for _, f in fragments) == call.arguments  # the same string, as written
        assert len(fragments) > 1  # streamed as written, not in one piece
        first_head = next(end for end, d in deltas if d["index"] == i)
        assert first_head < fragments[0][0] or fragments[0][1] == "{"
        assert fragments[0][0] < text.index(call.arguments) + len(call.arguments)  # before the call ended


def test_arguments_are_the_models_own_text():
    """Whitespace as the model wrote it, in the whole parse as in the stream (OpenAI's
    arguments are the model's string); arguments written as a JSON string are decoded."""
    text = '<tool_call>\n{"name": "add", "arguments": {"a":1,  "b": 2}}\n</tool_call>'
    (call,) = get_parser("hermes").parse(text)[1]
    assert call.arguments == '{"a":1,  "b": 2}'
    (call,) = get_parser("hermes").parse('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>')[1]
    assert json.loads(call.arguments) == {"a": 1}
    stream = StreamingToolParser(get_parser("hermes"))
    sent = [d for end in range(1, len(text) + 1) for d in stream.feed(text[:end], end == len(text))[1]]
    assert "".join(d["function"]["arguments"] for d in sent) == '{"a":1,  "b": 2}'


def test_auto_picks_the_format_from_the_template():
    assert parser_for_template("{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert parser_for_template("<|python_tag|>").name == "llama3_json"
    assert parser_for_template("<tool_call>").name == "hermes"
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        get_parser("pythonic")


@pytest.mark.parametrize("name", ["hermes", "mistral"])
def test_an_answer_cut_off_inside_its_start_marker_drops_it_streamed_or_not(name):
    """max_tokens may end an answer before its start marker is whole (``<tool``): it is the
    same unfinished call as one cut inside the call, dropped whole or streamed; a finish of
    its own keeps such text."""
    parser = get_parser(name)
    for before in ("", "Let me check. "):
        for k in range(1, len(parser.start)):
            end = before + parser.start[:k]
            message, _ = ChatAnswer(get_parser(name), None).message(end, "length")
            assert message["content"] == (before.rstrip() or None), (end, message)
            streamed, _ = _streamed_answer(name, end, "length")
            assert streamed == before.rstrip(), (end, streamed)
    kept = "I print <t"
    assert ChatAnswer(get_parser(name), None).message(kept, "stop")[0]["content"] == kept


def _streamed_answer(name: str, text: str, finish: str) -> tuple[str, list[tuple[str, str]]]:
    """The content and the calls (name, arguments) a stream of ``text`` sent, fed a
    character at a time and ending with ``finish``."""
    answer, content, calls = ChatAnswer(get_parser(name), None), "", {}
    for i in range(1, len(text) + 1):
        delta, _ = answer.delta(0, text[:i], finish if i == len(text) else None)
        content += (delta or {}).get("content", "")
        for part in (delta or {}).get("tool_calls", []):
            name_and_args = calls.setdefault(part["index"], ["", ""])
            name_and_args[0] += part["function"].get("name") or ""
            name_and_args[1] += part["function"].get("arguments") or ""
    return content, [(n, a) for n, a in (calls[k] for k in sorted(calls))]


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


CUT_CASES = [*CASES.items(), ("mistral", '[TOOL_CALLS]{"name": "f", "arguments": {"a":1}}'),
             ("llama3_json", '<|python_tag|>\n{"name": "f", "parameters": {"a":1}}'), ("llama3_json", " < a <\n"),
             ("llama3_json", "Hi <|python_tag|>"),
             ("mistral", 'a [TOOL_CALLS] [{"name": "f", "arguments": {"a":1}}, {"name": "g", "arguments": {}}]')]


@pytest.mark.parametrize("name,text", CUT_CASES)
def test_an_answer_cut_anywhere_is_the_same_streamed_or_not(name, text):
    """max_tokens may end an answer at any character: the whole answer's content and calls
    are what the stream sent, a last call whose arguments were cut off included as far as
    it went (OpenAI returns it so; it was left out, so an agent saw an empty answer); a
    call cut off after its arguments (only ``}`` or ``</tool_call>`` missing) is whole."""
    for k in range(1, len(text) + 1):
        message, finish = ChatAnswer(get_parser(name), None).message(text[:k], "length")
        whole = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        content, calls = _streamed_answer(name, text[:k], "length")
        assert finish == "length"
        assert (message["content"] or "", whole) == (content, calls), text[:k]
        assert all(_is_json_object(args) for _, args in whole[:-1])  # only the last may be cut
    closer_cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call'
    message, _ = ChatAnswer(get_parser("hermes"), None).message(closer_cut, "length")
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
