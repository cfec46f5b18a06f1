"""Run a Python module as a child that stops with its parent:
``python -m runtime.server.orphan_guard [--watch-only] PARENT_PID MODULE ARGS...``.

``forkserve serve --dp-size N`` starts its replicas and the gateway through this, in their
own sessions (so a terminal's Ctrl-C reaches only the parent, which stops them in order);
``ServerProcess`` (tests, benchmarks, the DSL's ``Runtime``) starts its server through it.
If the parent dies without stopping the child (SIGKILL, OOM, a killed test run), the child
gets SIGTERM and shuts down as usual (a forkserve server stops its scheduler and
detokenizer). Two mechanisms:

- Linux's ``PR_SET_PDEATHSIG``: the kernel sends the signal, so it works while the child's
  Python is blocked in native code holding the interpreter lock (SGLang's gateway runs its
  whole server inside one call). But it is documented (``man 2 prctl``) to fire when the
  parent *thread* that started the child ends, so ``--watch-only`` leaves it out for a
  parent that may start children from short-lived threads.
- A watcher thread that sees the child re-parented (within half a second), sends SIGTERM
  where the kernel does not, and exits outright if the child is still running a minute
  later. A module that stops on a signal sets ``stop_requested`` when its stop begins, so
  that the watcher does not send a second one into its shutdown (a whole process group
  signalled, e.g. by ``timeout``, loses the parent too).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import runpy
import signal
import sys
import threading
import time

_POLL_S = 0.5
_GRACE_S = 60.0
_PR_SET_PDEATHSIG = 1
WATCH_ONLY = "--watch-only"
stop_requested = threading.Event()  # set by the guarded module when it has begun to stop


def interrupt(signum: int, frame: object) -> None:
    """A SIGTERM (or SIGINT) handler: the same shutdown as Ctrl-C's, with ``stop_requested``
    set so that the watcher adds no signal of its own to it."""
    stop_requested.set()
    raise KeyboardInterrupt


def stop_with_parent(parent_pid: int, *, death_signal: bool = True) -> None:
    """Exit at once if ``parent_pid`` is not (any longer) this process's parent; else get
    SIGTERM when it goes (``death_signal``: also from the kernel, see above)."""
    kernel_signals = death_signal and sys.platform.startswith("linux")
    if kernel_signals:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the signal was set up
        print(f"orphan_guard: parent process {parent_pid} is gone; not starting", file=sys.stderr, flush=True)
        sys.exit(1)

    # Run as ``python -m``, this file is ``__main__``; the guarded module imports (and sets)
    # the ``stop_requested`` of ``runtime.server.orphan_guard``, another module object.
    stopping = importlib.import_module(__spec__.name).stop_requested if __spec__ else stop_requested

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_POLL_S)
        # a second signal would cut a shutdown under way short
        if not kernel_signals and not stopping.is_set():
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(_GRACE_S)
        os._exit(1)

    threading.Thread(target=watch, name="stop-with-parent", daemon=True).start()


def guarded_command(module: str, parent_pid: int | None = None, *, watch_only: bool = False) -> list[str]:
    """The command that runs ``python -m module`` guarded, as a child of ``parent_pid``
    (by default this process)."""
    parent = str(os.getpid() if parent_pid is None else parent_pid)
    return [sys.executable, "-m", __name__, *([WATCH_ONLY] if watch_only else []), parent, module]


def main(argv: list[str]) -> None:
    watch_only = argv[:1] == [WATCH_ONLY]
    argv = argv[watch_only:]
    if len(argv) < 2:
        sys.exit(f"usage: python -m runtime.server.orphan_guard [{WATCH_ONLY}] PARENT_PID MODULE [ARGS...]")
    stop_with_parent(int(argv[0]), death_signal=not watch_only)
    module = argv[1]
    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
