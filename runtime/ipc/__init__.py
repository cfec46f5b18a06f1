"""The one codec for messages between processes, and the ZMQ socket helpers.

Messages are pickled with protocol 5 so numpy arrays (token ids) leave as out-of-band raw
buffers: they travel as extra ZMQ frames, never as Python lists of ints.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import zmq


def encode(msg: Any) -> list[Any]:
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(msg, protocol=5, buffer_callback=buffers.append)
    return [head, *(b.raw() for b in buffers)]


def decode(frames: list[Any]) -> Any:
    head, *buffers = frames
    return pickle.loads(head, buffers=buffers)


def send(sock: zmq.Socket, msg: Any, flags: int = 0) -> None:
    sock.send_multipart(encode(msg), flags=flags, copy=False)


def recv(sock: zmq.Socket, flags: int = 0) -> Any:
    return decode(sock.recv_multipart(flags=flags, copy=False))


def recv_all(sock: zmq.Socket) -> list[Any]:
    """Every message waiting on ``sock``, without blocking."""
    out = []
    while True:
        try:
            out.append(recv(sock, zmq.NOBLOCK))
        except zmq.Again:
            return out


async def recv_async(sock: Any) -> Any:
    """``recv`` for a ``zmq.asyncio`` socket."""
    return decode(await sock.recv_multipart(copy=False))


def new_ipc_names(count: int) -> list[str]:
    """Fresh ``ipc://`` endpoints, unique per server start."""
    base = f"{tempfile.gettempdir()}/forkserve-{uuid.uuid4().hex[:12]}"
    return [f"ipc://{base}-{i}" for i in range(count)]


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (another process may take it later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def remove_ipc_files(names: list[str]) -> None:
    """Delete the socket files that ``ipc://`` endpoints leave behind."""
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name.removeprefix("ipc://"))


def _socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    """A socket that never blocks a send and never drops a message: no high-water mark.
    What is queued is bounded by the requests themselves; at the default mark (1,000
    messages) a /generate batch of 300k prompts queued 299k send futures in the HTTP
    process, each removed from a list when sent: quadratic, minutes with the event loop
    stuck."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    return sock


def bind(ctx: zmq.Context, kind: int, endpoint: str) -> zmq.Socket:
    sock = _socket(ctx, kind)
    sock.bind(endpoint)
    return sock


def connect(ctx: zmq.Context, kind: int, endpoint: str) -> zmq.Socket:
    sock = _socket(ctx, kind)
    sock.connect(endpoint)
    return sock


def exit_with_parent(parent_pid: int, period_s: float = 0.5, endpoints: list[str] | tuple[str, ...] = ()) -> None:
    """In a child process: a daemon thread that ends the process as soon as ``parent_pid``
    is no longer its parent, even while the main thread is blocked (loading a model,
    joining a process group), so that a killed server leaves no orphans behind. It first
    deletes the socket files of ``endpoints`` (the ``ipc://`` names the child was given),
    which the parent, killed or stopped before it could, left behind."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(period_s)
        remove_ipc_files(list(endpoints))
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


@contextlib.contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """Processes started inside ignore SIGINT from their first instruction (the disposition
    survives exec), so a terminal's Ctrl-C, which reaches the whole process group, does not
    print a traceback from a child still importing; the parent stops them. Main thread only
    (elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_named(target: str, *args: Any) -> None:
    """Call ``target`` (``"package.module:function"``) with ``args``. As a spawned process's
    target it lets the parent name what the child runs without importing it: the HTTP
    process would otherwise import the scheduler's module, and with it torch and the model
    code, ~1.5 s of a start it never uses."""
    import importlib

    module, function = target.split(":")
    getattr(importlib.import_module(module), function)(*args)
