"""Run a Python module as a child that dies with its parent:
``python -m runtime.server.orphan_guard PARENT_PID MODULE ARGS...``.

``forkserve serve --dp-size N`` starts its replicas and the gateway through this, in their
own sessions (so a terminal's Ctrl-C reaches only the parent, which stops them in order).
If the parent is killed outright (SIGKILL, OOM), Linux sends the child SIGTERM
(``PR_SET_PDEATHSIG``), so no replica or gateway outlives it; a forkserve replica then
stops its own scheduler and detokenizer as usual.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the signal was set up
        sys.exit(1)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m runtime.server.orphan_guard PARENT_PID MODULE [ARGS...]")
    die_with_parent(int(argv[0]))
    module = argv[1]
    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
