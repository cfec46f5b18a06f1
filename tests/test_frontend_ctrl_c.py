"""Ctrl-C in a DSL program: ``run``, ``run_batch`` (also generator style) and a streamed
run's reader stop at once, and nothing more is sent to the server."""

from __future__ import annotations

import signal
import threading

import pytest

import frontend_lang as sgl
from tests.dsl_checks import CountingEndpoint, pinned_programs, wait_until_idle

pytestmark = pytest.mark.slow


@sgl.function
def _many_gens(s, i: int = 0, gens: int = 40):
    s += f"Program {i}. Write many words:"
    for k in range(gens):
        s += sgl.gen(f"g{k}", max_tokens=8, temperature=0.8, ignore_eos=True)


@pytest.mark.parametrize("how", ["run", "run_batch", "stream", "generator_style"])
def test_ctrl_c_stops_a_program_and_nothing_more_is_sent(server, how, ctrl_c):
    """Ctrl-C used to wait for every queued gen of every program to run on the server; a
    streamed run's reader (the body runs on a thread of its own) stopped nothing."""
    backend = CountingEndpoint(server.url)
    timer = threading.Timer(1.0, signal.pthread_kill, (ctrl_c, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            if how == "run_batch":
                _many_gens.run_batch([{"i": i} for i in range(8)], backend=backend)
            elif how == "generator_style":
                for _ in _many_gens.run_batch([{"i": i} for i in range(8)], backend=backend, generator_style=True):
                    pass
            elif how == "stream":
                for _ in _many_gens.run(gens=120, backend=backend, stream=True).text_iter():
                    pass
            else:
                _many_gens.run(gens=120, backend=backend)
    finally:
        timer.cancel()
    full = 8 * 40 if how in ("run_batch", "generator_style") else 120
    sent = backend.sent
    assert sent < full / 2, f"{sent} of {full} gens were sent"
    wait_until_idle(server.url)  # the gens already sent end on their own
    assert backend.sent == sent  # the programs' threads send nothing more
    # ended, and a gen that finished after the end pinned nothing
    assert pinned_programs(server.url) == 0


def test_programs_ending_after_their_endpoint_shut_down_end_quietly(server, caplog):
    """After Ctrl-C a benchmark shuts its endpoint down while programs on worker threads are
    still ending: each one's release of its cache pins went to a closed client and logged
    'could not release the cache pins ... Bad file descriptor', one line per program. A shut
    down endpoint sends nothing (the server lets the pins go after --program-pin-timeout)."""
    backend = sgl.RuntimeEndpoint(server.url)
    state = _many_gens.run(i=0, gens=1, backend=backend)
    assert state.error() is None
    backend.shutdown()
    with caplog.at_level("WARNING"):
        backend.end_program("a-program")  # raised on the closed client before
    assert not caplog.records
