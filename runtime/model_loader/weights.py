"""Read an HF-style model folder: ``config.json`` plus ``*.safetensors`` shards."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import safe_open

if TYPE_CHECKING:  # torch is imported where tensors are read: the HTTP and detokenizer processes never need it
    import torch


def iter_safetensors(folder: str | os.PathLike[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for every tensor in every ``*.safetensors`` file of ``folder``.

    Files are visited in sorted order so that iteration is deterministic across runs
    (sharded checkpoints are named ``model-00001-of-0000N.safetensors``). Tensors are
    read one at a time, so a caller that copies each into its own buffers never holds
    the whole checkpoint twice.
    """
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                yield name, handle.get_tensor(name)


def load_hf_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Return the parsed ``config.json`` of an HF-style model folder."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {folder}")
    return read_json_file(path)


def read_json_file(path: Path) -> Any:
    """A model folder's JSON file, parsed; ``ValueError`` naming the file where it is not
    JSON (json's own message names none)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # not JSON, or not UTF-8
        raise ValueError(f"{path} is not valid JSON: {err}") from err
