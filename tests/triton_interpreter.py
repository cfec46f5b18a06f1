"""For test modules of the Triton kernels on a CPU machine: call ``enter_interpreter()`` before
importing anything from ``kernels.triton``, then ``require_interpreted(kernel)`` after.

``TRITON_INTERPRET=1`` must be set before the kernels are decorated (at import); the
interpreter runs every program in Python, so shapes stay small. It computes ``tl.dot``
wrongly in bfloat16; elementwise bfloat16 is fine. Compiled kernels are tested on a GPU by
``tests/gpu``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch


def enter_interpreter() -> None:
    """Sets ``TRITON_INTERPRET=1``, or skips the calling module (on a CUDA machine, without
    triton, or with a triton whose interpreter is too old)."""
    if torch.cuda.is_available():
        # The interpreter would also take over kernels meant for the GPU in this process.
        pytest.skip("on a CUDA machine the Triton kernels are tested compiled, by tests/gpu", allow_module_level=True)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton)")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9):
        # 3.6's interpreter fails on loop bounds loaded from memory (numpy 2 scalars); 3.9 works.
        pytest.skip(f"Triton's CPU interpreter needs triton>=3.9 here, found {triton.__version__}",
                    allow_module_level=True)


def require_interpreted(kernel: Any) -> None:
    """Skips the calling module when ``kernel`` was decorated before ``TRITON_INTERPRET=1``
    was set (another module imported it first)."""
    from kernels.triton import interpreter_requested

    if not interpreter_requested() or type(kernel).__name__ != "InterpretedFunction":
        pytest.skip(
            "the Triton kernels were loaded without TRITON_INTERPRET=1 (set it before importing triton)",
            allow_module_level=True,
        )
