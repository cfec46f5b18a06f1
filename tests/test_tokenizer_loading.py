"""``runtime.tokenizer.load_hf_tokenizer`` loads the generic fast tokenizer without
AutoTokenizer (whose imports pull in torch) and otherwise hands AutoTokenizer a plain config
to skip importing the model family's config module; the tokenizer must be the one
AutoTokenizer builds on its own (the oracle), whichever way it was loaded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

TEXTS = ["Hello world", "  leading spaces\n\nand <|im_start|> markers", "a\n\n\nb  \n c", "wörld 123 + 4.5e-3 ```py\nx=1```", ""]


def _folder_naming(model_dir, tmp_path, tokenizer_class, model_type):
    """A copy of the default model's tokenizer and config whose tokenizer_config.json names
    ``tokenizer_class`` (None: names no class) and whose config.json names ``model_type``."""
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("tokenizer.json", "generation_config.json"):
        shutil.copy(model_dir / name, folder / name)
    (folder / "config.json").write_text(json.dumps({**json.loads((model_dir / "config.json").read_text()),
                                                    "model_type": model_type}))
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.pop("tokenizer_class", None)
    if tokenizer_class is not None:
        config["tokenizer_class"] = tokenizer_class
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("named", "model_type"), [("as converted", "llama"), ("TokenizersBackend", "mistral"),
                                                   ("TokenizersBackend", "qwen2"), ("GPT2Tokenizer", "llama"),
                                                   (None, "llama")])
def test_the_tokenizer_equals_autotokenizers_own(model_dir, tmp_path, named, model_type):
    """The generic class the GGUF conversion writes, for a model type whose AutoTokenizer keeps
    it (loaded directly) and for one whose AutoTokenizer puts the family's class in its place
    (Qwen2's), a model family's class (AutoTokenizer with a plain config) and none
    (AutoTokenizer alone)."""
    from transformers import AutoTokenizer

    from runtime.tokenizer import load_hf_tokenizer

    folder = model_dir if named == "as converted" else _folder_naming(model_dir, tmp_path, named, model_type)
    ours, theirs = load_hf_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
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


def test_the_processes_that_only_tokenize_do_not_import_torch(model_dir):
    """The HTTP and detokenizer processes never compute: importing their code, loading the
    tokenizer and spawning the children leaves torch (~1.5 s of every start in each)
    unimported in the HTTP process. The children's modules, which need it, are named to
    the processes that run them (checked here to resolve), not imported there."""
    code = (
        "import multiprocessing, sys; from pathlib import Path\n"
        "import runtime.server.launch, runtime.server.http_server, runtime.detokenizer, runtime.cli\n"
        "from runtime.config import ServerArgs; from runtime.serve_args import HttpArgs\n"
        "from runtime.tokenizer import Tokenizer\n"
        f"model_dir = Path({str(model_dir)!r})\n"
        "Tokenizer(model_dir).apply_chat_template([{'role': 'user', 'content': 'hi'}])\n"
        "started = []\n"
        "class Child:\n"
        "    def __init__(self, target, args, name): self.target, self.args = target, args\n"
        "    def start(self): started.append(self)\n"
        "class Spawn:\n"
        "    Process = Child\n"
        "multiprocessing.get_context = lambda method: Spawn\n"
        "runtime.server.launch.Launcher(ServerArgs(), HttpArgs())._spawn(model_dir)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
        "import importlib\n"
        "for child in started:\n"
        "    module, function = child.args[0].split(':')\n"
        "    assert child.target.__name__ == 'run_named' and callable(getattr(importlib.import_module(module), function))\n"
        "print(len(started))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "2"], done.stdout


@pytest.mark.parametrize("broken", ["tokenizer.json", "tokenizer_config.json", "generation_config.json"])
def test_a_tokenizer_file_that_is_not_json_is_named(model_dir, tmp_path, broken):
    """json's own message names no file ("Expecting value: line 1 column 1"); the error
    ``forkserve serve`` prints in one line must say which file it is."""
    from runtime.tokenizer import Tokenizer

    for path in model_dir.iterdir():
        (tmp_path / path.name).symlink_to(path)
    (tmp_path / broken).unlink()
    (tmp_path / broken).write_text("not json{")
    with pytest.raises(ValueError, match=rf"{broken} is not valid JSON: Expecting value"):
        Tokenizer(tmp_path)
