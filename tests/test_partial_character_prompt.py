"""A prompt of token ids that ends inside a character (an RL or agent loop resending ids cut
mid-character): the output's first bytes complete that character, and the output's text
has it whole, never as U+FFFD. Oracle: the full decode of prompt + output, less the text
of the prompt without its partial character. And an output cut inside a character ends
before it, so the texts of two calls, the second resending the first's ids, join into
the text of all the ids."""

from __future__ import annotations

import pytest

from runtime.incremental_text import IncrementalText, decode_after, partial_char_context

JAPANESE = "日本語の文章。日本"


@pytest.fixture(scope="module")
def tok(model_dir):
    from runtime.tokenizer import Tokenizer

    return Tokenizer(model_dir)


def _expected(tok, prompt: list[int], output: list[int]) -> str:
    head = tok.decode(prompt)
    assert head.endswith("\ufffd")
    return tok.decode(prompt + output)[len(head) - 1 :]


def test_the_character_split_between_prompt_and_output_is_the_outputs(tok):
    ids = tok.hf.encode(JAPANESE, add_special_tokens=False)
    prompt, output = ids[:-2], ids[-2:]  # the prompt ends with the first bytes of the last 日
    context = partial_char_context(prompt, tok.token_bytes.ends_inside_character)
    assert context == tuple(prompt[-4:])
    assert tok.decode(output).startswith("\ufffd")  # what the output alone decodes to
    assert decode_after(tok.decode, context, output) == _expected(tok, prompt, output) == "日本"
    # the streamed text: one token at a time, the same, never a U+FFFD
    stream = IncrementalText(context=context)
    shown = []
    for t in output:
        stream.feed(tok.decode, [t])
        shown.append(stream.text)
    assert shown == ["日", "日本"]
    assert tok.output_text(output, {"type": "length", "length": 2}, _Params(), context) == "日本"


def test_a_prompt_that_ends_on_a_whole_character_has_no_context(tok):
    ends_inside = tok.token_bytes.ends_inside_character
    assert partial_char_context(tok.hf.encode("日本語", add_special_tokens=False), ends_inside) == ()
    assert partial_char_context(tok.hf.encode("Hi 🙂", add_special_tokens=False), ends_inside) == ()
    assert partial_char_context([], ends_inside) == ()


def test_an_output_that_starts_a_new_character_leaves_the_prompts_partial_one(tok):
    ids = tok.hf.encode(JAPANESE, add_special_tokens=False)
    prompt = ids[:-2]
    output = tok.hf.encode(" hello", add_special_tokens=False)
    context = partial_char_context(prompt, tok.token_bytes.ends_inside_character)
    assert decode_after(tok.decode, context, output) == " hello"


class _Params:
    skip_special_tokens = True
    no_stop_trim = False
    include_stop_str_in_output = False
    stop: tuple[str, ...] = ()


@pytest.mark.slow
def test_engine_output_completes_the_prompts_character(engine):
    ids = engine.tokenizer.hf.encode(JAPANESE, add_special_tokens=False)[:-2]
    greedy = {"temperature": 0, "max_new_tokens": 6}
    out = engine.generate(input_ids=ids, sampling_params=greedy)
    assert out["text"] == _expected(engine.tokenizer, ids, out["output_ids"]) and "\ufffd" not in out["text"], out
    chunks = [c["text"] for c in engine.generate(input_ids=ids, sampling_params=greedy, stream=True)]
    assert chunks[-1] == out["text"] and all(out["text"].startswith(c) for c in chunks), chunks


def test_an_output_cut_inside_a_character_leaves_it_to_the_next_call(tok):
    ids = tok.hf.encode(JAPANESE, add_special_tokens=False)
    prompt, first, second = ids[:3], ids[3:5], ids[5:]  # 語 is split between the two calls
    assert tok.decode(prompt + first).endswith("\ufffd")
    cut = {"type": "length", "length": len(first)}
    ends_inside = tok.token_bytes.ends_inside_character
    first_text = tok.output_text(first, cut, _Params(), partial_char_context(prompt, ends_inside))
    second_text = tok.output_text(second, cut, _Params(), partial_char_context(prompt + first, ends_inside))
    assert "\ufffd" not in first_text + second_text
    assert tok.decode(prompt) + first_text + second_text == tok.decode(ids)
