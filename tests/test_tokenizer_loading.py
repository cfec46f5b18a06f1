"""``runtime.tokenizer.load_hf_tokenizer`` hands AutoTokenizer a plain config to skip
importing the model family's config module; the tokenizer must be the one AutoTokenizer
builds on its own (the oracle)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TEXTS = ["Hello world", "  leading spaces\n\nand <|im_start|> markers", "wörld 123 + 4.5e-3 ```py\nx=1```", ""]


def test_the_tokenizer_equals_autotokenizers_own(model_dir):
    from transformers import AutoTokenizer

    from runtime.tokenizer import load_hf_tokenizer

    ours, theirs = load_hf_tokenizer(model_dir), AutoTokenizer.from_pretrained(str(model_dir))
    assert type(ours) is type(theirs)
    assert len(ours) == len(theirs) and ours.get_vocab() == theirs.get_vocab()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "chat_template"):
        assert getattr(ours, name) == getattr(theirs, name), name
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text)
        ids = theirs.encode(text)
        assert ours.decode(ids) == theirs.decode(ids)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXTS[1]}]
    assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == theirs.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True)


def test_a_text_keeps_its_own_repeated_bos_where_the_tokenizer_adds_none(model_dir):
    """Only a BOS the tokenizer itself adds is dropped when the text starts with one (see
    ``tests/test_server_token_ids.py`` for a tokenizer that adds it); SmolLM2's adds none, so
    a text's own leading markers all stay, as AutoTokenizer encodes them."""
    from transformers import AutoTokenizer

    from runtime.tokenizer import Tokenizer

    ours, theirs = Tokenizer(model_dir), AutoTokenizer.from_pretrained(str(model_dir))
    assert ours.adds_bos is False
    text = theirs.bos_token * 2 + "hi"
    assert ours.encode(text) == theirs.encode(text) and ours.encode(text)[:2] == [theirs.bos_token_id] * 2
