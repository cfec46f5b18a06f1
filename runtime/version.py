"""The installed package's version, for ``forkserve --version`` and ``sgl.__version__``."""

from __future__ import annotations


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("forkserve")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
