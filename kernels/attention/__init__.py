"""Registry of attention backends, imported lazily so CPU-only installs never touch CUDA,
Triton or FlashInfer.

Where each backend runs:
  - ``torch_native``: anywhere (the reference, and the CPU path without a C++ compiler);
  - ``cpu``: CPU, with a C++ compiler to build its kernel once (``kernels/cpu/build.py``);
  - ``triton``: CUDA; on CPU only inside Triton's interpreter (``TRITON_INTERPRET=1``, tests);
  - ``flashinfer``: CUDA with the ``flashinfer-python`` package (``pip install .[cuda]``).
Asking for a backend where it cannot run is a ``ValueError`` that says what is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend, AttentionShape

_BACKENDS: dict[str, tuple[str, str]] = {
    "torch_native": ("kernels.attention.torch_native", "TorchNativeBackend"),
    "cpu": ("kernels.attention.cpu_backend", "CpuBackend"),
    "triton": ("kernels.attention.triton_backend", "TritonBackend"),
    "flashinfer": ("kernels.attention.flashinfer_backend", "FlashInferBackend"),
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def check_backend_can_run(name: str, device: str) -> None:
    """Raise ``ValueError`` naming the missing piece if backend ``name`` cannot run on ``device``."""
    from kernels.triton import interpreter_requested, triton_installed

    if name not in _BACKENDS:
        raise ValueError(f"attention backend {name!r} is unknown; available: {', '.join(available_backends())}")
    on_cuda = device.startswith("cuda")
    if name == "cpu":
        from kernels.cpu.build import CpuKernelsUnavailable, load_kernels

        if device != "cpu":
            raise ValueError(f"attention backend 'cpu' runs on the CPU only; got device {device!r}")
        try:
            load_kernels()
        except CpuKernelsUnavailable as exc:
            raise ValueError(f"attention backend 'cpu' cannot run here: {exc}") from exc
    elif name == "triton":
        if not triton_installed():
            raise ValueError("attention backend 'triton' needs the triton package: pip install triton")
        if not on_cuda and not interpreter_requested():
            raise ValueError(
                f"attention backend 'triton' needs a CUDA device, or TRITON_INTERPRET=1 in the environment "
                f"(set before triton is imported) to run its kernels in Triton's CPU interpreter; got device "
                f"{device!r}. Use torch_native on CPU."
            )
    elif name == "flashinfer":
        if not on_cuda:
            raise ValueError(f"attention backend 'flashinfer' needs a CUDA device; use torch_native on {device}")
        if importlib.util.find_spec("flashinfer") is None:
            raise ValueError(
                "attention backend 'flashinfer' needs the flashinfer-python package: pip install .[cuda] "
                "(or pick --attention-backend triton)"
            )


def create_attention_backend(name: str, device: str, shape: AttentionShape | None = None) -> AttentionBackend:
    """The backend ``name`` for ``device``. ``shape`` (this rank's heads and head size) is
    required by the fast backends, which plan their kernels before the first layer runs."""
    check_backend_can_run(name, device)
    simple = name in ("torch_native", "cpu")
    if not simple and shape is None:
        raise ValueError(f"attention backend {name!r} needs the attention shape (heads, KV heads, head size)")
    module, cls = _BACKENDS[name]
    backend_cls = getattr(importlib.import_module(module), cls)
    return backend_cls() if simple else backend_cls(shape, device)
