"""The built wheel carries every file the code opens at run time, not only the modules: the
CPU kernels' sources (compiled on the user's machine) and the shipped chat templates. An
editable install reads them from the checkout, so only a real wheel shows one missing."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kernels.cpu import build

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # builds a wheel (~20 s)


def test_the_wheel_has_the_kernel_sources_and_the_templates(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("forkserve-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"kernels/cpu/{name}" for name in (*build.SOURCES, *build.HEADERS)}
    wanted |= {str(p.relative_to(ROOT)) for p in (ROOT / "runtime").rglob("*.jinja")}
    assert any(name.endswith(".jinja") for name in wanted)
    assert wanted <= names, f"missing from the wheel: {sorted(wanted - names)}"
