"""Compile the C++ CPU kernels once per machine and load them with ctypes.

The sources ship with the package (``*.cpp``, ``*.h``); on first use they are compiled
with the system C++ compiler (``$CXX``, else ``c++``/``g++``/``clang++``) for this CPU
(``-march=native``) with OpenMP, into one library under ``<user cache>/forkserve/kernels/``.
The file name carries a hash of the sources, the flags, the compiler and the CPU's feature flags, so an
edit, another compiler or a cache folder shared with a different CPU gets a fresh build.
The sources compile in parallel, one compiler per core (about 8 s on 2 cores); later
starts load the cached library.

OpenMP: the library links ``libgomp.so.1``. Loaded after torch, it binds to the runtime
torch already loaded, so its threads are torch's threads, not a second pool fighting for
the same cores.

``FORKSERVE_AMX_EMULATE=1`` builds (into its own file) a library whose AMX kernels run each
tile instruction as plain C++ (``amx.h``), so their logic is tested on CPUs without AMX
(``tests/test_amx_emulated.py``). ``FORKSERVE_AVX512_EMULATE=1`` likewise builds the
AVX-512 kernels for a CPU with only AVX2 and FMA, their intrinsics from SIMDe's headers
(``isa.h``; Debian's ``libsimde-dev``), so that they are tested there
(``tests/test_avx512_emulated.py``). Both are slow and meant for tests only.

There is no fallback: if no compiler is found or the build fails, :func:`load_kernels`
raises ``CpuKernelsUnavailable`` with the compiler's message, and the caller decides
(``--attention-backend torch_native`` needs no compiler).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import platformdirs

SOURCE_DIR = Path(__file__).parent
SOURCES = ("paged_attention.cpp", "attention_rows.cpp", "attention_rows_avx2.cpp", "shared_prefix.cpp", "attention_amx.cpp", "elementwise.cpp", "linear_bf16.cpp", "linear_f32.cpp", "linear_blocks.cpp", "linear_amx.cpp", "decoder_layers.cpp", "machine_probe.cpp")
HEADERS = ("aligned.h", "amx.h", "avx512_emulated.h", "bf16.h", "entries.h", "gemm_panel.h", "isa.h", "online_softmax.h", "paged_batch.h", "panel_prefetch.h", "row_passes.h", "simd.h", "stealing_ranges.h")
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-std=c++17", "-shared", "-fPIC")
_COMPILERS = ("c++", "g++", "clang++")


class CpuKernelsUnavailable(RuntimeError):
    """The CPU kernels cannot be built or loaded here; the message says why."""


def find_compiler() -> str | None:
    """The C++ compiler to use: ``$CXX`` if set, else the first of c++/g++/clang++ on PATH."""
    if os.environ.get("CXX"):
        return shutil.which(os.environ["CXX"])
    return next((path for name in _COMPILERS if (path := shutil.which(name))), None)


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


# Test-only builds, each into a file of its own: environment variable -> define.
EMULATIONS = {"FORKSERVE_AMX_EMULATE": "-DFORKSERVE_AMX_EMULATE", "FORKSERVE_AVX512_EMULATE": "-DFORKSERVE_AVX512_EMULATE"}


def _flags() -> tuple[str, ...]:
    """FLAGS, plus the define of each emulation whose environment variable is ``1``."""
    return (*FLAGS, *(define for name, define in EMULATIONS.items() if os.environ.get(name) == "1"))


def library_path(compiler: str) -> Path:
    key = hashlib.sha256()
    texts = [(SOURCE_DIR / name).read_bytes() for name in (*SOURCES, *HEADERS)]
    for part in (*texts, " ".join(_flags()).encode(), compiler.encode(), _cpu_flags().encode(), platform.machine().encode()):
        key.update(part)
    cache = Path(os.environ.get("FORKSERVE_KERNEL_CACHE") or Path(platformdirs.user_cache_dir("forkserve")) / "kernels")
    return cache / f"forkserve_cpu-{key.hexdigest()[:16]}.so"


def _compile(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"forkserve: compiling the CPU kernels into {target} (once)", file=sys.stderr)
    # Build in a folder beside the target and rename: concurrent starts never load a
    # half-written file, and a failed build leaves nothing behind.
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        # One compiler process per source, as many at once as there are cores (a
        # one-process build of all of them took ~2x as long on 2 cores), then one link.
        jobs = [(name, str(Path(work) / f"{Path(name).stem}.o")) for name in SOURCES]
        with ThreadPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            runs = list(pool.map(lambda job: _run(compiler, "-c", str(SOURCE_DIR / job[0]), "-o", job[1]), jobs))
        failed = [(f"compiling {name}", run.stderr) for (name, _), run in zip(jobs, runs, strict=True) if run.returncode]
        library = str(Path(work) / target.name)
        if not failed:
            link = _run(compiler, *(obj for _, obj in jobs), "-o", library)
            failed = [("linking the kernels", link.stderr)] if link.returncode else []
        if failed:
            raise CpuKernelsUnavailable(
                "".join(f"{what} with {compiler} failed:\n{err.strip()}\n" for what, err in failed)
                + "Use --attention-backend torch_native to run without compiled kernels."
            )
        os.replace(library, target)


def _run(compiler: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([compiler, *_flags(), *args], capture_output=True, text=True)


_P, _I64, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
# Argument types of each entry point (one per dtype suffix: _f32, _bf16), as in the sources.
_SIGNATURES = {
    "paged_attention": ([_P, _P, _P, _I64, _P, _I64, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _F, _I64, _P, _INT], _INT),
    "rms_norm": ([_P, _P, _P, _P, _I64, _I64, _F, _INT], None),
    "rotary": ([_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _INT], _INT),
    "silu_and_mul": ([_P, _P, _I64, _I64, _INT], None),
    "store_kv": ([_P, _I64, _P, _I64, _P, _I64, _I64, _I64, _P, _P, _I64, _INT], _INT),
    "decoder_layers": ([_P, _P, _I64, _P, _P, _P, _INT], _INT),
}
# Entry points with one storage type only (no suffix).
_PLAIN_SIGNATURES = {
    "argmax_rows_f32": ([_P, _I64, _I64, _P, _INT], None),
    "linear_f32_available": ([], _INT),
    "linear_f32_cpu_has_avx512": ([], _INT),
    "linear_f32_packed_numel": ([_I64, _I64], _I64),
    "linear_f32_pack": ([_P, _I64, _I64, _P], None),
    "linear_f32": ([_P, _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _INT], _INT),
    "decoder_layer_bytes": ([], _I64),
    "linear_blocks_available": ([], _INT),
    "linear_blocks_few_rows": ([_INT], _I64),
    "linear_blocks_packed_bytes": ([_INT, _I64, _I64], _I64),
    "linear_blocks_pack": ([_INT, _P, _I64, _I64, _P, _INT], _INT),
    "linear_blocks": ([_INT, _P, _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _INT], _INT),
    "linear_bf16_available": ([], _INT),
    "linear_bf16_packed_bytes": ([_I64, _I64], _I64),
    "linear_bf16_pack": ([_P, _I64, _I64, _P], None),
    "linear_bf16": ([_P, _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _INT], _INT),
    "linear_bf16_vector": ([_P, _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _INT], _INT),
    "linear_bf16_set_amx_min_rows": ([_I64], _I64),
    "linear_bf16_set_small_prefetch": ([_I64], _I64),
    "linear_bf16_set_widen_min_rows": ([_I64], _I64),
    "linear_amx_available": ([], _INT),
    "paged_attention_set_amx_min_tokens": ([_I64], _I64),
    "paged_attention_set_widened": ([_I64], _I64),
    "paged_attention_rows_available": ([], _INT),
    "paged_attention_set_bf16_rows_avx2": ([_I64], _I64),
    "paged_attention_set_shared_min_keys": ([_I64], _I64),
    "paged_attention_shared_min_keys": ([_I64], _I64),
    "paged_attention_set_shared_min_rows": ([_I64], _I64),
    "paged_attention_set_shared_on_tiles": ([_I64], _I64),
    "paged_attention_shared_groups": ([_I64, _P, _I64, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _P, _P], _I64),
    "paged_attention_last_grouped_tokens": ([], _I64),
    "paged_attention_last_shared_on_tiles": ([], _I64),
    "paged_attention_last_shared_extend_blocks": ([], _I64),
    "linear_amx": ([_P, _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _INT], _INT),
    "linear_amx_silu_mul": ([_P, _I64, _I64, _I64, _P, _I64, _P, _I64, _INT], _INT),
    "linear_bf16_silu_mul": ([_P, _I64, _I64, _I64, _P, _I64, _P, _I64, _INT], _INT),
    "probe_read": ([_P, _I64, _INT], ctypes.c_uint64),
    "probe_bf16_dots": ([_I64, _INT, _P], _INT),
    "probe_f32_fmas": ([_I64, _INT, _P], _INT),
    "probe_amx_tiles": ([_I64, _INT, _P], _INT),
}


@functools.cache
def load_kernels() -> ctypes.CDLL:
    """The compiled kernel library (built on first call), with argument types declared."""
    import torch  # noqa: F401  (torch's OpenMP runtime must be loaded first; see above)

    compiler = find_compiler()
    if compiler is None:
        raise CpuKernelsUnavailable(
            "the CPU attention kernel needs a C++ compiler with OpenMP (g++ or clang++; or set CXX), and none "
            "was found on PATH. Install one (e.g. `apt install g++`) or use --attention-backend torch_native."
        )
    path = library_path(compiler)
    if not path.exists():
        _compile(compiler, path)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise CpuKernelsUnavailable(f"loading {path} failed: {exc}") from exc
    for name, (argtypes, restype) in _SIGNATURES.items():
        for suffix in ("f32", "bf16"):
            fn = getattr(lib, f"{name}_{suffix}")
            fn.argtypes, fn.restype = argtypes, restype
    for name, (argtypes, restype) in _PLAIN_SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib
