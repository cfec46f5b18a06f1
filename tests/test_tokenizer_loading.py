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
