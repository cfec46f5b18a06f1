"""SGLang's own package, for tests that run its frontend against our server or read its
request schemas. It pins its own xgrammar, torch and server dependencies, so it lives in a
venv of its own (over this environment's packages for torch and numpy, ``--no-deps`` for
sglang itself plus the few modules ``sglang.lang`` imports), kept under the user cache and
reused. Creating it needs PyPI."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

SGLANG = "sglang==0.5.23"
# what `import sglang` needs beyond this environment's packages (found by importing it)
SGLANG_IMPORTS = ["psutil", "pybase64", "msgspec", "aiohttp", "pillow", "requests", "orjson"]


def sglang_venv() -> Path:
    """The venv's folder, created on first use."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "forkserve" / "test-venvs"
    home = cache / SGLANG.replace("==", "-")
    python = home / "bin" / "python"
    if not (home / ".complete").exists():
        venv.EnvBuilder(system_site_packages=True, with_pip=True, clear=True).create(home)
        for args in (["--no-deps", SGLANG], SGLANG_IMPORTS):
            done = subprocess.run([str(python), "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
            assert done.returncode == 0, f"installing {args} into {home} failed:\n{done.stderr[-2000:]}"
        (home / ".complete").write_text("ok\n")
    return home


def sglang_source(relative: str) -> Path:
    """A file of the installed ``sglang`` package, e.g. ``srt/managers/io_struct.py``."""
    found = sorted(sglang_venv().glob(f"lib/python3*/site-packages/sglang/{relative}"))
    assert found, f"sglang/{relative} is not in {sglang_venv()}"
    return found[0]
