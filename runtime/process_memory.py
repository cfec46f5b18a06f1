"""This process's memory as the system sees it (Linux), and glibc's ``malloc_trim``, which
gives back the freed memory glibc keeps (the HTTP process after a large request,
``runtime/server/memory_trim.py``; an offline ``Engine`` at ``shutdown``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_mib() -> int | None:
    """This process's resident memory (Linux), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE >> 20
    except (OSError, ValueError, IndexError):
        return None


def c_library() -> ctypes.CDLL | None:
    """This process's C library, or None where it cannot be found."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def glibc_trim() -> Callable[[], int] | None:
    """``malloc_trim(0)`` of this process's C library, where it is glibc."""
    trim = getattr(c_library(), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)
