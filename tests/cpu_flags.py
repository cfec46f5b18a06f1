"""This CPU's feature flags as /proc/cpuinfo lists them (empty where it cannot be read), for
tests that need a given instruction set."""

from __future__ import annotations


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[-1].split())
