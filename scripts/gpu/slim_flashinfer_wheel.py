"""Repack the ``flashinfer-python`` wheel without the sources of kernel families the engine
never builds, so it fits the 64 MiB that can travel to the GPU machine.

The wheel is pure Python plus CUDA sources that FlashInfer compiles just in time (about
100 MB compressed in 0.7.x, most of it MoE, GEMM, quantisation and training kernels). The
attention path compiles only the top-level files of ``flashinfer/data/csrc`` (the batch
prefill/decode templates and their bindings) against ``data/include``, CUTLASS, CCCL and
spdlog. So the repacked wheel keeps:

- every Python file, JSON and text file (the package imports all its modules at start-up);
- ``flashinfer/data/{include,cutlass,cccl,spdlog}`` whole;
- the files directly in ``flashinfer/data/csrc`` (not its subfolders);

and drops CUDA/C sources elsewhere. The version is unchanged; ``RECORD`` is rewritten to
list what is left, and ``flashinfer/SLIMMED.txt`` says what was removed.

Usage: python scripts/gpu/slim_flashinfer_wheel.py IN.whl OUT_DIR
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path, PurePosixPath

SOURCE_SUFFIXES = {".cu", ".cuh", ".h", ".hpp", ".c", ".cc", ".cpp", ".inc", ".jinja", ".cubin", ".ptx", ".so"}
KEEP_DATA_TREES = ("flashinfer/data/include/", "flashinfer/data/cutlass/", "flashinfer/data/cccl/", "flashinfer/data/spdlog/")
CSRC = "flashinfer/data/csrc/"


def keep(name: str) -> bool:
    if name.endswith("/") or ".dist-info/" in name:
        return True
    if name.startswith(KEEP_DATA_TREES):
        return True
    if name.startswith(CSRC):
        return "/" not in name[len(CSRC) :]  # top-level csrc files only
    if name.startswith("flashinfer/data/"):
        return PurePosixPath(name).suffix not in SOURCE_SUFFIXES
    return PurePosixPath(name).suffix not in SOURCE_SUFFIXES


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(wheel: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel.name
    removed: list[str] = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in src.infolist():
            if info.filename == record_name:
                continue
            if not keep(info.filename):
                removed.append(info.filename)
                continue
            data = src.read(info.filename)
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            if not info.filename.endswith("/"):
                lines.append(_record_line(info.filename, data))
        note = (
            "Repacked by forkserve's scripts/gpu/slim_flashinfer_wheel.py for attention-only use; "
            f"{len(removed)} source files of other kernel families were removed.\n"
        ).encode()
        dst.writestr("flashinfer/SLIMMED.txt", note)
        lines.append(_record_line("flashinfer/SLIMMED.txt", note))
        lines.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(lines) + "\n")
    print(f"{target}: {target.stat().st_size / 2**20:.1f} MiB ({len(removed)} files removed)")
    return target


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    slim(Path(sys.argv[1]), Path(sys.argv[2]))
