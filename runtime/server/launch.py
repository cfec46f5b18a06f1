"""``forkserve serve``: start the scheduler and detokenizer processes, serve HTTP here, and
watch them.

Startup order: bind the port (fail fast if taken), find the model (fail fast if missing),
spawn the processes, wait for the scheduler's ready message (or its load error), start
HTTP, push one token through the pipeline, then print the URL. If a child process dies,
every open request gets a 500, ``/health`` turns 503 and the server exits with code 1 so a
supervisor can restart it (a replica of ``--dp-size`` first says so and waits
``FAILURE_NOTICE_ENV`` seconds, so that its launcher takes it out of the gateway and the
gateway retries those requests elsewhere). SIGINT/SIGTERM stop everything within a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import multiprocessing
import os
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime import ipc
from runtime.arg_fields import field_names, fields_as_flags
from runtime.config import ServerArgs
from runtime.serve_args import HttpArgs
from runtime.server.orphan_guard import interrupt, stop_requested
from runtime.server.response_store import SqliteTable
from runtime.server.tools.template import load_chat_template

logger = logging.getLogger("forkserve")

_CHILD_STOP_TIMEOUT_S = 3.0
# Seconds in-flight requests may still finish after SIGINT/SIGTERM before they are answered 503.
_GRACE_S = 1.5
# Seconds after that before uvicorn cancels the handlers still running: the 503s must be sent
# first, also when the compute threads keep this process waiting for a core (1 s was seen
# to be too short on 2 busy cores: a stream was cut instead of ending with its error event).
_ANSWER_S = 3.0
# After a second Ctrl-C, seconds the open requests' 503s may take before the server quits.
_HURRY_S = 1.0
# Set (to seconds) in a replica's environment by ``forkserve serve --dp-size``: when a child
# process dies, the server prints ``DEAD_PROCESS_LINE`` and waits that long before failing
# its open requests, so that they are not retried on it (the launcher watches for the line).
FAILURE_NOTICE_ENV = "FORKSERVE_FAILURE_NOTICE_S"
DEAD_PROCESS_LINE = "forkserve: the {} process died; failing open requests and exiting"


class StartupError(Exception):
    pass


def bind_port(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        hint = " (is another server running there?)" if err.errno == errno.EADDRINUSE else ""
        reason = err.strerror or str(err)  # socket.gaierror (a host that does not resolve) has no strerror
        raise StartupError(f"cannot listen on {host}:{port}: {reason}{hint}") from err
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def describe_engine(info: dict[str, Any], args: ServerArgs) -> str:
    """What runs, in one line: dtype, device, attention backend, compute threads, KV pool
    size, the weights' memory, context length and prefill chunk in tokens, the GEMM kernels and, on CUDA, the elementwise ones
    (from the scheduler's ready message), and the settings that change what to expect
    (tensor parallel, no radix cache)."""
    threads = f", {info['num_threads']} compute threads" if info.get("num_threads") else ""
    kernel = f" ({info['attention_kernel']})" if info.get("attention_kernel") else ""
    elementwise = f", {info['elementwise']}" if info.get("elementwise") else ""
    tp = f", tensor parallel over {args.tp_size}" if args.tp_size > 1 else ""
    no_cache = ", radix cache off (no prefix reuse)" if args.disable_radix_cache else ""
    weights = f", weights {info['weight_bytes'] / 2**30:.2f} GiB" if info.get("weight_bytes") else ""
    chunk = info["chunked_prefill_size"]
    prefill = "prefill steps of any size" if chunk == -1 else f"prefill chunks of {chunk:,} tokens"
    return (f"{info['dtype']} on {info['device']}{tp}, attention backend {info['attention_backend']}{kernel}{threads}, "
            f"KV pool {info['max_total_tokens']:,} tokens{weights}, context {info['max_context_len']:,} tokens, {prefill}, "
            f"{info['gemm']}{elementwise}{no_cache}")


def default_model_name(model_path: str | None, model_dir: Path) -> str:
    if model_path is None:
        return "SmolLM2-135M-Instruct"
    return Path(model_path).name or str(model_dir)


class Launcher:
    def __init__(self, args: ServerArgs, http: HttpArgs) -> None:
        self.args, self.http = args, http
        self.children: dict[str, multiprocessing.process.BaseProcess] = {}
        self.ipc_names = ipc.new_ipc_names(3)
        self.exit_code = 0
        self.announced_ready = False  # the ready line is out

    def run(self) -> int:
        sock = bind_port(self.http.host, self.http.port)
        try:
            from runtime.model_loader import resolve_model_path

            try:
                model_dir = resolve_model_path(self.args.model_path)
            except Exception as err:
                raise StartupError(f"the model could not be found or prepared: {err}") from err
            tokenizer = self._check_model(model_dir)
            try:
                load_chat_template(self.http.chat_template)
            except (OSError, ValueError) as err:
                raise StartupError(f"--chat-template: {err}") from err
            if self.http.response_store is not None:
                try:
                    SqliteTable(self.http.response_store, "responses").close()
                except sqlite3.Error as err:
                    raise StartupError(f"--response-store {self.http.response_store}: {err}") from err
            self._spawn(model_dir)
            runner: Any = asyncio.run
            with contextlib.suppress(ImportError):
                import uvloop

                runner = uvloop.run
            runner(self._serve(sock, model_dir, tokenizer))
            return self.exit_code
        finally:
            sock.close()
            self._stop_children()

    def _spawn(self, model_dir: Path) -> None:
        to_scheduler, to_detokenizer, _ = self.ipc_names
        mp = multiprocessing.get_context("spawn")
        pid = os.getpid()
        # named, not imported: this process needs neither torch nor the model code
        self.children["scheduler"] = mp.Process(
            target=ipc.run_named,
            args=("runtime.scheduler.process:run_scheduler_process", self.args, str(model_dir), to_scheduler,
                  to_detokenizer, pid),
            name="forkserve-scheduler",
        )
        self.children["detokenizer"] = mp.Process(
            target=ipc.run_named,
            args=("runtime.detokenizer:run_detokenizer_process", str(model_dir), to_detokenizer, self.ipc_names[2],
                  pid, self.args.log_level),
            name="forkserve-detokenizer",
        )
        with ipc.children_ignore_sigint():
            for proc in self.children.values():
                proc.start()

    def dead_child(self) -> str | None:
        for name, proc in self.children.items():
            if not proc.is_alive():
                return f"{name} (exit code {proc.exitcode})"
        return None

    @staticmethod
    def _check_model(model_dir: Path) -> Any:
        """The model's tokenizer, after its config is read and its architecture checked: in a
        second, before any process starts, a broken model folder is one line, not a child's
        traceback."""
        from runtime.model_loader.weights import load_hf_config
        from runtime.models.config import ModelConfig
        from runtime.tokenizer import Tokenizer

        try:
            ModelConfig.from_hf(load_hf_config(model_dir))
            return Tokenizer(model_dir)
        except (OSError, ValueError, KeyError) as err:  # KeyError: a config without a needed field
            what = f"missing field {err}" if isinstance(err, KeyError) else " ".join(str(err).split())
            raise StartupError(f"the model in {model_dir} cannot be loaded: {what}") from err

    async def _serve(self, sock: socket.socket, model_dir: Path, tokenizer: Any) -> None:
        import uvicorn

        from runtime.constrained.spec import import_grammar_engine
        from runtime.server.context import ServerContext
        from runtime.server.http_server import create_app, probe_generate
        from runtime.server.memory_trim import trim_when_grown
        from runtime.server.metrics import ServerMetrics
        from runtime.server.scheduler_client import SchedulerClient

        # while the model loads: a constrained request would import it on the event loop
        threading.Thread(target=import_grammar_engine, name="import xgrammar", daemon=True).start()
        to_scheduler, _, to_tokenizer = self.ipc_names
        client = SchedulerClient(to_scheduler, to_tokenizer, ServerMetrics())
        client.request_log.configure(self.http.log_requests, self.http.log_requests_level, self.http.log_requests_format)
        client.request_log.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        await client.wait_ready(self.http.startup_timeout, self.dead_child)
        names = self.http.served_model_name or (default_model_name(self.args.model_path, model_dir),)
        ctx = ServerContext(client, tokenizer, self.args, self.http, names[0], self.args.model_path or str(model_dir),
                            client.info, other_model_names=names[1:])
        ctx.role_markers = tokenizer.role_markers(ctx.chat_template_override)
        ctx.process_ids = {"http": os.getpid(), **{n: p.pid for n, p in self.children.items() if p.pid}}
        receiver = client.start()
        config = uvicorn.Config(
            # log_config None: uvicorn's lines go through this process's setup (log_setup.py)
            create_app(ctx), log_level=self.http.log_level_http, log_config=None, timeout_graceful_shutdown=_GRACE_S + _ANSWER_S, timeout_keep_alive=30,
            lifespan="off",
        )
        def answer_open_requests() -> None:  # a second Ctrl-C: no grace period
            ctx.end_open_requests()  # requests arriving now get the 503 too

        server = _server(config, answer_open_requests)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        monitor = asyncio.create_task(self._watch(ctx, server))
        trimming = asyncio.create_task(trim_when_grown())  # freed memory back to the system
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        ctx.is_ready = True
        if not serving.done():
            if await probe_generate(ctx, timeout=max(60.0, self.http.startup_timeout)):
                print(f"forkserve: {describe_engine(client.info, self.args)}", flush=True)
                host = f"[{self.http.host}]" if ":" in self.http.host else self.http.host
                key = "; requests need the --api-key bearer" if self.http.api_key else ""
                print(f"forkserve ready: http://{host}:{self.http.port} (model {names[0]}; OpenAI API under /v1{key})", flush=True)
                self.announced_ready = True
            elif not server.should_exit:  # (a signal during the test ends it too: that is no failure)
                print("forkserve: the first test generation failed; shutting down", file=sys.stderr, flush=True)
                self.exit_code = 1
                server.should_exit = True
        await serving
        ctx.is_shutting_down = True
        monitor.cancel()
        trimming.cancel()
        receiver.cancel()

    async def _watch(self, ctx: Any, server: Any) -> None:
        while True:
            await asyncio.sleep(0.25)
            if server.should_exit:  # SIGINT/SIGTERM: uvicorn stops taking connections
                ctx.is_shutting_down = True  # and new requests on open ones get a 503
                # Requests still running after the grace period get a JSON 503 (streams an
                # error event and [DONE]) before uvicorn cancels their handlers.
                await asyncio.sleep(_GRACE_S)
                ctx.end_open_requests()
                return
            dead = self.dead_child()
            if dead:
                print(DEAD_PROCESS_LINE.format(dead), file=sys.stderr, flush=True)
                await asyncio.sleep(float(os.environ.get(FAILURE_NOTICE_ENV) or 0))
                ctx.client.fail_all(f"the {dead} process died")
                ctx.grace_over.set()  # bodies still arriving: answered too, not left to the shutdown's cancel
                self.exit_code = 1
                await asyncio.sleep(0.2)  # let handlers answer before the server stops
                server.should_exit = True
                return

    def _stop_children(self) -> None:
        for proc in self.children.values():
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + _CHILD_STOP_TIMEOUT_S
        for proc in self.children.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        ipc.remove_ipc_files(self.ipc_names)


def _server(config: Any, answer_open_requests: Callable[[], None]) -> Any:
    """uvicorn's server, except that a second Ctrl-C, which uvicorn takes as "quit without
    waiting for the handlers" (they were then cancelled mid-answer: 500s, cut streams and a
    traceback each), first answers the open requests (503, streams an error event) and
    quits once they are sent, or after ``_HURRY_S``; a third Ctrl-C quits at once."""
    import uvicorn

    class Server(uvicorn.Server):
        hurried = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            stop_requested.set()
            if sig == signal.SIGINT and self.should_exit and not self.hurried:
                self.hurried = True
                self._captured_signals.append(sig)
                loop = asyncio.get_event_loop()
                loop.call_soon_threadsafe(answer_open_requests)
                loop.call_soon_threadsafe(loop.call_later, _HURRY_S, setattr, self, "force_exit", True)
                return
            super().handle_exit(sig, frame)

    return Server(config)


def stopped_by_signal(was_ready: bool, exit_code: int = 0) -> int:
    """What a server stopped by SIGINT/SIGTERM says, and its exit code: ``exit_code`` once it
    was ready, 130 (an interrupted command) before."""
    if not was_ready and exit_code == 0:
        print("forkserve: interrupted before the server was ready", file=sys.stderr, flush=True)
        return 130
    print("forkserve: shut down", file=sys.stderr, flush=True)
    return exit_code


def serve(args: ServerArgs, http: HttpArgs) -> int:
    """Run the server until SIGINT/SIGTERM (exit code 0; 130 before it was ready, as an
    interrupted command) or a child process dies (1)."""
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    launcher = Launcher(args, http)
    try:
        return launcher.run()
    except KeyboardInterrupt:
        return stopped_by_signal(launcher.announced_ready, launcher.exit_code)
    except StartupError as err:
        print(f"forkserve: {err}", file=sys.stderr)
        return 1
    except RuntimeError as err:  # the model failed to load, a process died during startup
        print(f"forkserve: {fields_as_flags(str(err), field_names(ServerArgs, HttpArgs))}", file=sys.stderr)
        return 1
