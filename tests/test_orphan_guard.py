"""``runtime.server.orphan_guard``: a child started through it gets SIGTERM when its parent
dies, even by SIGKILL (what keeps ``--dp-size``'s replicas from outliving the launcher)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.proc_utils import pid_alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# ``python -m timeit`` stands in for a long-running module: it reads its arguments from sys.argv.
SLEEPER = ["timeit", "-n", "1", "import time; time.sleep(60)"]


def test_the_child_dies_with_its_parent():
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import os, subprocess, sys, time\n"
         f"child = subprocess.Popen([sys.executable, '-m', 'runtime.server.orphan_guard', str(os.getpid()), *{SLEEPER!r}])\n"
         "print(child.pid, flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    child = int(parent.stdout.readline())
    time.sleep(1.0)  # the child has set up its death signal
    assert pid_alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child), "the child outlived its parent"


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    done = subprocess.run([sys.executable, "-m", "runtime.server.orphan_guard", str(os.getpid() + 10**6), *SLEEPER],
                          timeout=30)
    assert done.returncode == 1
