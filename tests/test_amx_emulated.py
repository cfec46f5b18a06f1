"""The AMX kernels (``linear_amx.cpp``, ``attention_amx.cpp``) tested on any CPU with
AVX512-BF16, AMX or not: their own tests run again in a child pytest against a kernel
library built with ``FORKSERVE_AMX_EMULATE=1``, where ``amx.h`` carries out each tile
instruction in plain C++ as Intel's manual defines it. What that checks is the kernels'
part: tiling, strides, zero padding, the overlapping last block, work stealing, the tile
configuration and the shapes each product is given (the emulation aborts on what the
hardware would fault on). The tile unit itself is checked only on an AMX CPU, where the same
tests run natively.

The emulated library is only for this: tile instructions in plain C++ are slow, and the
child runs only correctness tests (no speed test can pass on it)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.cpu import build
from runtime.config import cpu_flags

ROOT = Path(__file__).resolve().parent.parent

# The tests of the AMX paths, by pytest -k expression per file: the attention tests with every
# extend on tiles, and the forked-decode tests as a server runs them (shared keys on tiles).
# Not the row-threshold test: it tells the two GEMM kernels apart by last bits in which real
# tiles and the vector kernel differ, and the emulated tiles (Intel's order of the two
# products of a pair) and this CPU's vdpbf16ps do not.
AMX_TESTS = {
    "tests/test_cpu_packed_linear.py": "amx",
    "tests/test_cpu_attention.py": "native_amx_always or ((sharing or forked) and [native-)",
}


pytestmark = [
    pytest.mark.skipif(build.find_compiler() is None, reason="no C++ compiler on PATH"),
    pytest.mark.skipif(platform.system() != "Linux" or "avx512_bf16" not in cpu_flags(),
                       reason="the AMX kernels are built around AVX512-BF16 on Linux; this CPU has none"),
]


def _run_amx_tests(test_file: str, expression: str, kernel_cache: Path) -> str:
    env = {**os.environ, "FORKSERVE_AMX_EMULATE": "1", "FORKSERVE_KERNEL_CACHE": str(kernel_cache)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", test_file, "-k", expression],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return output


@pytest.mark.slow
@pytest.mark.parametrize("test_file", sorted(AMX_TESTS))
def test_the_amx_kernels_pass_their_tests_on_emulated_tiles(test_file, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "amx_emulated_kernels"  # one build for both files
    output = _run_amx_tests(test_file, AMX_TESTS[test_file], cache)
    summary = output.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 0, summary
    # every selected test ran: none skipped for want of AMX tiles
    assert "skipped" not in summary, output[-6000:]


def test_the_emulated_library_is_a_build_of_its_own(monkeypatch):
    """The define changes the library's name, so the emulated build never replaces the
    machine's own (nor is loaded by a server)."""
    compiler = build.find_compiler()
    monkeypatch.delenv("FORKSERVE_AMX_EMULATE", raising=False)
    native = build.library_path(compiler)
    monkeypatch.setenv("FORKSERVE_AMX_EMULATE", "1")
    assert build.library_path(compiler) != native
