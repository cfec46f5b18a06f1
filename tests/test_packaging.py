"""The built wheel carries every file the code opens at run time, not only the modules: the
CPU kernels' sources (compiled on the user's machine) and the shipped chat templates. An
editable install reads them from the checkout, so only a real wheel shows one missing."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kernels.cpu import build

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # builds a wheel (~20 s)
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


def test_no_other_installed_package_is_named_kernels():
    """This project's top-level ``kernels`` package is the one ``import kernels`` finds, and no
    installed distribution ships another (Hugging Face's ``kernels``, which transformers 5.25
    requires, does: then one of the two shadows the other; pyproject.toml keeps transformers
    below 5.25)."""
    owners = set(importlib.metadata.packages_distributions().get("kernels", [])) - {"forkserve"}
    assert not owners, (f"{sorted(owners)} install a top-level `kernels` package, the import name of "
                        "forkserve's kernels/: uninstall it (pip uninstall kernels) or keep transformers < 5.25")
    spec = importlib.util.find_spec("kernels")
    assert spec is not None and Path(spec.origin).resolve() == ROOT / "kernels" / "__init__.py"
