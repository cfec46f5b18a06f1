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
