"""Reasoning parsers on stand-in texts with think markers (no model): whole and streamed
(character by character) give the same reasoning and content, and markers never leak; with
stream_reasoning false the reasoning comes in one delta, once it has ended."""

from __future__ import annotations

import pytest

from runtime.server.reasoning import PARSERS, StreamingReasoning

CASES = [
    ("deepseek-r1", "The user wants a number.\nTwo plus two is four.</think>\n\nThe answer is 4.",
     "The user wants a number.\nTwo plus two is four.", "The answer is 4."),
    ("deepseek-r1", "<think>short</think>Done.", "short", "Done."),
    ("deepseek-r1", "still thinking when cut off", "still thinking when cut off", ""),
    ("qwen3", "<think>\nLet me think.\n</think>\n\nHello!", "\nLet me think.\n", "Hello!"),
    ("qwen3", "No thinking here.", "", "No thinking here."),
    ("qwen3", "<think>cut off", "cut off", ""),
]


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
def test_whole_and_streamed_agree(name, text, reasoning, content):
    parser = PARSERS[name]
    got_reasoning, got_content, _ = parser.split(text)
    assert (got_reasoning, got_content) == (reasoning, content)
    stream = StreamingReasoning(parser)
    r_all, c_all = "", ""
    for end in range(1, len(text) + 1):
        r, c = stream.feed(text[:end], finished=end == len(text))
        r_all, c_all = r_all + r, c_all + c
        assert "<think" not in r_all + c_all and "</think" not in r_all + c_all
    assert (r_all, c_all) == (reasoning, content)


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
def test_reasoning_not_streamed_comes_whole_when_it_ends(name, text, reasoning, content):
    stream = StreamingReasoning(PARSERS[name], stream=False)
    deltas, c_all = [], ""
    for end in range(1, len(text) + 1):
        r, c = stream.feed(text[:end], finished=end == len(text))
        if r:
            deltas.append((end, r))
        c_all += c
    assert c_all == content
    assert [r for _, r in deltas] == ([reasoning] if reasoning else [])
    if deltas:  # sent when the end marker is complete, or at the end of a cut-off answer
        ends_at = text.find("</think>")
        assert deltas[0][0] == (ends_at + len("</think>") if ends_at >= 0 else len(text))


@pytest.mark.slow
def test_a_server_with_a_reasoning_parser_splits_reasoning():
    """A forced output (EBNF) stands in for a reasoning model: whole and streamed responses
    carry the same reasoning_content and content; separate_reasoning false keeps it whole."""
    import openai

    from runtime.server.server_process import ServerProcess

    proc = ServerProcess("--reasoning-parser", "deepseek-r1", "--max-total-tokens", "4000").wait_ready()
    try:
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0)
        kw = dict(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Hi"}], max_tokens=40,
                  extra_body={"ebnf": 'root ::= "I should greet them.</think>Hello there."'})
        msg = client.chat.completions.create(**kw).choices[0].message
        assert (msg.reasoning_content, msg.content) == ("I should greet them.", "Hello there.")
        reasoning = content = ""
        for chunk in client.chat.completions.create(**kw, stream=True):
            for choice in chunk.choices:
                reasoning += getattr(choice.delta, "reasoning_content", None) or ""
                content += choice.delta.content or ""
        assert (reasoning, content) == ("I should greet them.", "Hello there.")
        held = {**kw, "stream": True, "extra_body": {**kw["extra_body"], "stream_reasoning": False}}
        pieces = [d for chunk in client.chat.completions.create(**held)
                  for choice in chunk.choices if (d := getattr(choice.delta, "reasoning_content", None))]
        assert pieces == ["I should greet them."]  # one delta, not token by token
        whole = client.chat.completions.create(**{**kw, "extra_body": {**kw["extra_body"], "separate_reasoning": False}})
        assert whole.choices[0].message.content == "I should greet them.</think>Hello there."
        # vLLM's include_reasoning false: split off and dropped, whole or streamed
        hidden = {**kw, "extra_body": {**kw["extra_body"], "include_reasoning": False}}
        msg = client.chat.completions.create(**hidden).choices[0].message
        assert (msg.reasoning_content, msg.content) == (None, "Hello there.")
        deltas = [choice.delta for chunk in client.chat.completions.create(**hidden, stream=True)
                  for choice in chunk.choices]
        assert not any(getattr(d, "reasoning_content", None) for d in deltas)
        assert "".join(d.content or "" for d in deltas) == "Hello there."
        # a reasoning model whose template has no effort cannot honour one: a 400 naming it, on both routes
        with pytest.raises(openai.BadRequestError, match="reasoning_effort is not supported") as err:
            client.chat.completions.create(**kw, reasoning_effort="low")
        assert err.value.body["param"] == "reasoning_effort"
        with pytest.raises(openai.BadRequestError, match="reasoning.effort is not supported") as err:
            client.responses.create(model=kw["model"], input="Hi", reasoning={"effort": "low"})
        assert err.value.body["param"] == "reasoning.effort"
    finally:
        assert proc.stop() == 0


def test_the_flag_offers_every_parser():
    import dataclasses

    from runtime.serve_args import HttpArgs

    flag = {f.name: f for f in dataclasses.fields(HttpArgs)}["reasoning_parser"]
    assert flag.metadata["choices"] == list(PARSERS)
