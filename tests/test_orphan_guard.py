"""``runtime.server.orphan_guard``: a child started through it gets SIGTERM when its parent
dies, even by SIGKILL (what keeps ``--dp-size``'s replicas from outliving the launcher, and
a test's or benchmark's server from outliving a killed run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.proc_utils import descendants, pid_alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# ``python -m timeit`` stands in for a long-running module: it reads its arguments from sys.argv.
SLEEPER = ["timeit", "-n", "1", "import time; time.sleep(60)"]


def _start_guarded_child(*, watch_only: bool, from_a_thread: bool) -> tuple[subprocess.Popen, int]:
    """A parent that starts a guarded sleeper (from a thread that then ends, if asked) and
    sleeps; returns the parent and the child's pid."""
    start = f"subprocess.Popen([*guarded_command(SLEEPER[0], watch_only={watch_only}), *SLEEPER[1:]])"
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, threading, time\n"
         "from runtime.server.orphan_guard import guarded_command\n"
         f"SLEEPER = {SLEEPER!r}\n"
         "children = []\n"
         f"def start(): children.append({start})\n"
         + ("t = threading.Thread(target=start); t.start(); t.join()\n" if from_a_thread else "start()\n")
         + "print(children[0].pid, flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    child = int(parent.stdout.readline())
    time.sleep(1.0)  # the child has set up its guard
    return parent, child


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


@pytest.mark.parametrize("watch_only", [False, True], ids=["death-signal", "watch-only"])
def test_the_child_dies_with_its_parent(watch_only):
    parent, child = _start_guarded_child(watch_only=watch_only, from_a_thread=False)
    assert pid_alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _gone_within(child, 10), "the child outlived its parent"


def test_watch_only_outlives_the_thread_that_started_it():
    """The kernel's death signal fires when the starting *thread* ends; ``--watch-only``
    (``ServerProcess``'s choice) keeps the child until the parent process goes."""
    parent, child = _start_guarded_child(watch_only=True, from_a_thread=True)
    try:
        assert not _gone_within(child, 2), "the child died with the thread that started it"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert _gone_within(child, 10), "the child outlived its parent"


_STOPPER = """
import signal, sys, time
from runtime.server import orphan_guard

def on_term(signum, frame):
    with open(sys.argv[1], "a") as f:
        f.write("TERM\\n")
    orphan_guard.stop_requested.set()  # a stop has begun (forkserve serve's handlers do this)

signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
for _ in range(30):  # a slow shutdown
    time.sleep(0.1)
"""


def test_the_watcher_sends_no_second_signal_into_a_stop_under_way(tmp_path):
    """A process group signalled as a whole (``timeout``, a cancelled CI job) loses the
    parent too: the watcher must not add a SIGTERM to the one the child is handling."""
    (tmp_path / "slow_stopper.py").write_text(_STOPPER)
    log = tmp_path / "signals.txt"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "from runtime.server.orphan_guard import guarded_command\n"
         f"child = subprocess.Popen([*guarded_command('slow_stopper', watch_only=True), {str(log)!r}],"
         " stdout=subprocess.PIPE, text=True)\n"
         "child.stdout.readline()\n"
         "print(child.pid, flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    child = int(parent.stdout.readline())
    os.kill(child, signal.SIGTERM)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _gone_within(child, 10)
    assert log.read_text() == "TERM\n"


@pytest.mark.slow
def test_a_server_process_goes_with_a_killed_parent():
    """A killed test run or benchmark takes its ``ServerProcess`` (and the server's scheduler
    and detokenizer) with it."""
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import time\n"
         "from runtime.server.server_process import ServerProcess\n"
         "server = ServerProcess('--dtype', 'float32', '--max-total-tokens', '4096').wait_ready()\n"
         "print(server.proc.pid, flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    server = int(parent.stdout.readline())
    tree = [server, *descendants(server)]
    assert len(tree) >= 3, tree  # the server, its scheduler and its detokenizer
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    left = [pid for pid in tree if not _gone_within(pid, 30)]
    assert not left, f"left running after the parent was killed: {left}"


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    done = subprocess.run([sys.executable, "-m", "runtime.server.orphan_guard", str(os.getpid() + 10**6), *SLEEPER],
                          timeout=30)
    assert done.returncode == 1
