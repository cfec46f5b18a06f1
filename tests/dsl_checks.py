"""Checks the DSL tests share."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import httpx

import frontend_lang as sgl


def assert_failed(state: sgl.ProgramState, pattern: str) -> None:
    """As in SGLang, a failed operation ends the program without raising: ``run`` returns
    the state and ``error()`` says what failed."""
    assert isinstance(state.error(), sgl.ProgramError) and re.search(pattern, str(state.error())), state.error()


class CountingEndpoint(sgl.RuntimeEndpoint):
    """A ``RuntimeEndpoint`` that counts the requests it sends; ``on_send(count)`` runs before each."""

    def __init__(self, url: str, on_send: Callable[[int], None] | None = None) -> None:
        super().__init__(url)
        self.sent = 0
        self._on_send = on_send

    def _count(self) -> None:
        self.sent += 1
        if self._on_send is not None:
            self._on_send(self.sent)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self._count()
        return super().generate(*args, **kwargs)

    def generate_stream(self, *args: Any, **kwargs: Any) -> Any:
        self._count()
        return super().generate_stream(*args, **kwargs)


def wait_until_idle(url: str, timeout: float = 60) -> None:
    """Wait until the server at ``url`` runs no request (those already sent end on their
    own), then a little longer for anything a client would still send."""
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/get_load", timeout=10).json()[0]["num_reqs"] and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)


def pinned_programs(url: str) -> int:
    return httpx.get(url + "/get_server_info", timeout=10).json()["scheduler"]["num_pinned_programs"]
