"""Kernel tests run again in a child pytest against a test-only kernel build that emulates
instructions this CPU lacks (``kernels/cpu/build.py``'s ``EMULATIONS``): AMX tiles in plain
C++ (``amx.h``), AVX-512 from SIMDe's headers (``isa.h``)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from kernels.cpu import build
from runtime.config import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
SIMDE_HEADER = "simde/x86/avx512.h"


def avx512_emulation_unavailable() -> str | None:
    """Why this machine cannot build the AVX-512 kernels on emulated instructions, or None
    when it can (x86 Linux, AVX2 and FMA, no AVX-512, SIMDe's headers on the include path)."""
    compiler = build.find_compiler()
    if compiler is None:
        return "no C++ compiler on PATH"
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return "the AVX-512 kernels exist for x86 Linux only"
    if "avx512f" in cpu_flags():
        return "this CPU has AVX-512: its kernels' tests run natively"
    if not {"avx2", "fma"} <= cpu_flags():
        return "emulating AVX-512 needs AVX2 and FMA"
    probe = subprocess.run([compiler, "-x", "c++", "-std=c++17", "-fsyntax-only", "-"],
                           input=f"#include <{SIMDE_HEADER}>\n", capture_output=True, text=True)
    if probe.returncode:
        return (f"SIMDe's headers are not installed (<{SIMDE_HEADER}> not found): `apt-get install "
                "libsimde-dev` lets the AVX-512 kernels' tests run on this CPU")
    return None


def run_child_tests(test_files: Sequence[str], expression: str | None, emulations: dict[str, str],
                    kernel_cache: Path) -> str:
    """Run ``test_files`` (only the tests ``-k expression`` selects, when given) in one child
    pytest with the ``emulations`` environment set, against kernels built into
    ``kernel_cache``; fails with the child's output unless it passed. Returns that output."""
    env = {**os.environ, **emulations, "FORKSERVE_KERNEL_CACHE": str(kernel_cache)}
    select = ["-k", expression] if expression else []
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *test_files, *select],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return output
