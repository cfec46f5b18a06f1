"""Registry of attention backends, imported lazily so CPU-only installs never touch CUDA."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend

_BACKENDS: dict[str, tuple[str, str]] = {
    "torch_native": ("kernels.attention.torch_native", "TorchNativeBackend"),
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def create_attention_backend(name: str, device: str) -> AttentionBackend:
    if name not in _BACKENDS:
        raise ValueError(
            f"attention backend {name!r} is not available in this build; "
            f"available: {', '.join(available_backends())}"
        )
    if name != "torch_native" and not device.startswith("cuda"):
        raise ValueError(f"attention backend {name!r} needs a CUDA device; use torch_native on {device}")
    module, cls = _BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
