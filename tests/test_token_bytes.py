"""A token's bytes and name in OpenAI's logprobs, and where each token's text begins in a
choice's text (``runtime/token_bytes.py``), against the tokenizer's own decoding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(model_dir):
    return Tokenizer(model_dir)


def _decoded_before(tok: Tokenizer, ids: list[int], k: int, skip_special: bool) -> int:
    """The oracle: characters of the text of ``ids[:k]``, a trailing partial character left
    out (it belongs to the token that completes it)."""
    text = tok.hf.decode(ids[:k], skip_special_tokens=skip_special)
    whole = tok.hf.decode(ids, skip_special_tokens=skip_special)
    while text and not whole.startswith(text):  # the last character is not complete yet
        text = text[:-1]
    return len(text)


@settings(max_examples=80, deadline=None)
@given(pieces=st.lists(st.sampled_from(["Hi", " there", "é", "🦙", "龘", "<|im_end|>", "\n", "x"]), min_size=1,
                       max_size=10))
def test_offsets_are_where_each_tokens_text_begins(tok, pieces):
    ids = tok.hf.encode("".join(pieces), add_special_tokens=False)
    special = tok.token_bytes.special
    for unseen, skip in ((special, True), ((), False)):
        offsets = tok.token_bytes.char_offsets(ids, unseen=unseen)
        assert offsets == [_decoded_before(tok, ids, k, skip) for k in range(len(ids))]


def test_offsets_continue_across_a_split_character(tok):
    ids = tok.hf.encode("a🦙b", add_special_tokens=False)
    assert len(ids) > 3  # the llama takes several byte-level tokens
    whole = tok.token_bytes.char_offsets(ids)
    for cut in range(1, len(ids)):
        base = whole[cut]
        assert tok.token_bytes.char_offsets(ids[cut:], before=ids[:cut], base=base) == whole[cut:]


def test_a_token_with_part_of_a_character_is_named_by_its_bytes(tok):
    ids = tok.hf.encode("🦙", add_special_tokens=False)
    names = [tok.token_bytes.name(t) for t in ids]
    assert all(n.startswith("bytes:\\x") for n in names)
    assert b"".join(tok.token_bytes.of(t) for t in ids).decode() == "🦙"


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(st.sampled_from(["Hi", " there", "é", "🦙", "龘", "日本語", "<|im_end|>", "\n"]), min_size=1,
                       max_size=8))
def test_ends_inside_character_where_the_bytes_so_far_end_in_a_partial_one(tok, pieces):
    """Oracle: Python's strict UTF-8 decoding of the tokens' bytes fails at their end."""
    ids = tok.hf.encode("".join(pieces), add_special_tokens=False)
    for k in range(1, len(ids) + 1):
        raw = b"".join(tok.token_bytes.of(t) for t in ids[:k])
        try:
            raw.decode()
            cut = False
        except UnicodeDecodeError as err:
            cut = err.reason == "unexpected end of data"
        assert tok.token_bytes.ends_inside_character(ids[:k]) == cut, (ids[:k], raw)
