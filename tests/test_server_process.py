"""Where ``ServerProcess`` (the DSL's ``Runtime``, benchmarks, tests) reaches the server it
started: the ``--host`` it was given, wildcards as this machine's loopback."""

from __future__ import annotations

import pytest

from runtime.server.server_process import _connect_host


@pytest.mark.parametrize(("args", "host"), [
    ((), "127.0.0.1"),
    (("--max-total-tokens", "9000"), "127.0.0.1"),
    (("--host", "0.0.0.0", "--port", "1"), "127.0.0.1"),
    (("--host", "::1"), "[::1]"),
    (("--host", "::"), "[::1]"),
    (("--host", "10.1.2.3"), "10.1.2.3"),
    (("--host=::1",), "[::1]"),
    (("--host", "10.0.0.1", "--host", "10.0.0.2"), "10.0.0.2"),
])
def test_the_url_host_follows_the_servers_host_flag(args, host):
    assert _connect_host(args) == host


def test_a_port_in_the_flags_is_the_one_watched(monkeypatch):
    """``forkserve bench --server-args="--port 30705"``: the server listened there while the
    bench waited 180 s on the free port it had picked (the flag given last wins)."""
    import subprocess

    from runtime.server import server_process

    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, **kw: started.append(cmd))
    proc = server_process.ServerProcess("--port", "30705")
    assert proc.port == 30705 and proc.url.endswith(":30705") and started[0][-2:] == ["--port", "30705"]
    assert server_process.ServerProcess("--port=30706").port == 30706
    assert server_process.ServerProcess().port != 30705
