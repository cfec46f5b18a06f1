"""Where there is a C++ compiler, the CPU kernels build and load, and every kernel path the
CPU's features allow is present. The kernel tests skip (with the reason, shown by
``pytest -rs``) only for what this machine lacks: no compiler, no AVX512-BF16, no AMX. A
build that fails on a machine with a compiler must not turn into a quiet run of skips, so
this module fails instead."""

from __future__ import annotations

import platform

import pytest

from kernels.cpu import build, gemm_choice, linear_bf16
from kernels.cpu.build import CpuKernelsUnavailable
from runtime.config import cpu_flags


def _linux_at_least(major: int, minor: int) -> bool:
    if platform.system() != "Linux":
        return False
    numbers = platform.release().split("-")[0].split(".")
    try:
        return (int(numbers[0]), int(numbers[1])) >= (major, minor)
    except (IndexError, ValueError):
        return False


needs_compiler = pytest.mark.skipif(build.find_compiler() is None, reason="no C++ compiler on PATH: nothing to build")


@needs_compiler
def test_the_kernels_build_and_load_where_there_is_a_compiler():
    lib = build.load_kernels()  # raises CpuKernelsUnavailable with the compiler's message
    assert lib.paged_attention_bf16 and lib.store_kv_bf16 and lib.linear_bf16


@needs_compiler
@pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="this CPU has no AVX512-BF16")
def test_a_cpu_with_avx512_bf16_has_the_bf16_gemm():
    assert linear_bf16.available()


@needs_compiler
@pytest.mark.skipif(not {"amx_bf16", "amx_tile"} <= cpu_flags(), reason="this CPU has no AMX tiles")
@pytest.mark.skipif(not _linux_at_least(5, 16), reason="Linux grants AMX tile state from 5.16 on")
def test_a_cpu_with_amx_can_multiply_on_tiles():
    assert gemm_choice.amx_available()


@needs_compiler
def test_missing_or_failing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("FORKSERVE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(CpuKernelsUnavailable, match="C\\+\\+ compiler"):
        build.load_kernels.__wrapped__()
    monkeypatch.delenv("CXX")
    (tmp_path / "broken.cpp").write_text("this is not C++\n")
    for header in build.HEADERS:
        (tmp_path / header).write_text("")
    monkeypatch.setattr(build, "SOURCE_DIR", tmp_path)
    monkeypatch.setattr(build, "SOURCES", ("broken.cpp",))
    with pytest.raises(CpuKernelsUnavailable, match="failed") as err:
        build.load_kernels.__wrapped__()
    assert "torch_native" in str(err.value)
    assert not list(tmp_path.glob("*.so*")), "a failed build leaves nothing behind"
    assert "broken.cpp" in str(err.value)
