"""The AMX kernels (``linear_amx.cpp``, ``attention_amx.cpp``) tested on any CPU with
AVX512-BF16, AMX or not: their own tests run again in a child pytest against a kernel
library built with ``FORKSERVE_AMX_EMULATE=1``, where ``amx.h`` carries out each tile
instruction in plain C++ as Intel's manual defines it. What that checks is the kernels'
part: tiling, strides, zero padding, the overlapping last block, work stealing, the tile
configuration and the shapes each product is given (the emulation aborts on what the
hardware would fault on). The tile unit itself is checked only on an AMX CPU, where the same
tests run natively. On CPUs with neither AMX nor AVX512-BF16 but with AVX2, the AVX-512
instructions around the tiles are emulated too (``FORKSERVE_AVX512_EMULATE=1``, see
``tests/test_avx512_emulated.py``).

The emulated library is only for this: tile instructions in plain C++ are slow, and the
child runs only correctness tests (no speed test can pass on it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels.cpu import build
from runtime.config import cpu_flags
from tests.emulated_kernels import avx512_emulation_unavailable, run_child_tests

# The tests of the AMX paths, by pytest -k expression per file (None: all of them): the
# attention tests with every extend on tiles, and the forked-decode tests as a server runs
# them (shared keys on tiles).
# Not the row-threshold test: it tells the two GEMM kernels apart by last bits in which real
# tiles and the vector kernel differ, and the emulated tiles (Intel's order of the two
# products of a pair) and this CPU's vdpbf16ps do not.
AMX_TESTS: dict[str, str | None] = {
    "tests/test_cpu_linear_amx.py": None,  # every test
    "tests/test_cpu_packed_linear.py": "amx",
    "tests/test_cpu_attention.py": "native_amx_always or ((sharing or forked) and [native-)",
}



def _emulations() -> tuple[dict[str, str] | None, str]:
    """The environment of the child run (None where it cannot run here) and why not."""
    if build.find_compiler() is None:
        return None, "no C++ compiler on PATH"
    if "avx512_bf16" in cpu_flags():
        return {"FORKSERVE_AMX_EMULATE": "1"}, ""
    why_not = avx512_emulation_unavailable()
    if why_not is None:
        return {"FORKSERVE_AMX_EMULATE": "1", "FORKSERVE_AVX512_EMULATE": "1"}, ""
    return None, f"the AMX kernels are built around AVX512-BF16, which this CPU lacks ({why_not})"


EMULATIONS, _WHY_NOT = _emulations()
pytestmark = pytest.mark.skipif(EMULATIONS is None, reason=_WHY_NOT)


def _selection() -> str:
    """One ``-k`` expression for all of ``AMX_TESTS``: each file's tests (a test's keywords
    hold its module's name) as that file's expression selects them."""
    return " or ".join(f"({Path(f).stem} and ({expr}))" if expr else Path(f).stem for f, expr in AMX_TESTS.items())


@pytest.mark.slow
def test_the_amx_kernels_pass_their_tests_on_emulated_tiles(tmp_path_factory):
    # one child for every file (each child costs ~10 s of start-up on slow machines)
    cache = tmp_path_factory.getbasetemp() / "amx_emulated_kernels"
    output = run_child_tests(sorted(AMX_TESTS), _selection(), EMULATIONS, cache)
    summary = output.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 0, summary
    # every selected test ran: none skipped for want of AMX tiles
    assert "skipped" not in summary, output[-6000:]


def test_each_emulated_library_is_a_build_of_its_own(monkeypatch):
    """Each emulation's define changes the library's name, so an emulated build never
    replaces the machine's own (nor is loaded by a server)."""
    compiler = build.find_compiler()
    for name in build.EMULATIONS:
        monkeypatch.delenv(name, raising=False)
    paths = {build.library_path(compiler)}
    for name in build.EMULATIONS:
        monkeypatch.setenv(name, "1")
        paths.add(build.library_path(compiler))
    assert len(paths) == 1 + len(build.EMULATIONS)
