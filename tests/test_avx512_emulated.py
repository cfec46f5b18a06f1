"""The AVX-512 kernels (bf16 GEMM, bf16 decode and extend attention, the 16-lane norms,
rotary and SiLU, the compiled decoder layers) tested on CPUs with only AVX2 and FMA: their
own tests run again in a child pytest against a kernel library built with
``FORKSERVE_AVX512_EMULATE=1``, where each AVX-512 intrinsic comes from SIMDe's headers or
``avx512_emulated.h`` (``kernels/cpu/isa.h``). What that checks is the kernels' own logic
(tiling, masks and tails, thread splits, rounding to bfloat16, which path a shape takes);
the instructions themselves are checked where the CPU has them, by the same tests run
natively. The emulated library is slower and for these tests only."""

from __future__ import annotations

import re

import pytest

from tests.emulated_kernels import avx512_emulation_unavailable, run_child_tests

# Every test of each file: the AVX-512 build under every kernel choice they force. One child
# runs them all (each child pays ~10 s of start-up on the slow machines that run this).
AVX512_TESTS = (
    "tests/test_cpu_packed_linear.py",
    "tests/test_cpu_linear_f32.py",
    "tests/test_cpu_attention.py",
    "tests/test_cpu_fork_grouping.py",
    "tests/test_cpu_store_kv.py",
    "tests/test_cpu_elementwise.py",
    "tests/test_cpu_decoder_layers.py",
    "tests/test_gemm_choice.py",
    "tests/test_attention_choice.py",
)

# Not the tests of builds without a feature: each compiles a library of its own, not
# emulated, the same as in the native run (~20 s here for nothing new).
NOT_EMULATED = "not build_without and not cpu_without_bf16_packing"

_UNAVAILABLE = avx512_emulation_unavailable()
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or "")


@pytest.mark.slow
def test_the_avx512_kernels_pass_their_tests_on_emulated_instructions(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "avx512_emulated_kernels"
    output = run_child_tests(AVX512_TESTS, NOT_EMULATED, {"FORKSERVE_AVX512_EMULATE": "1"}, cache)
    summary = output.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 0, summary
    # nothing skipped for want of AVX-512 (AMX tiles and oneDNN's bf16 may still be missing)
    skips = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    assert not [line for line in skips if "AVX512" in line or "AVX-512" in line], "\n".join(skips)
