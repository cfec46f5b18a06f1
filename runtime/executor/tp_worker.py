"""Tensor-parallel ranks 1..N-1: each is a process that receives every step's batch from
rank 0 over ZMQ and runs the same forward on its slice of the model; the all-reduces inside
the layers keep the ranks in lockstep. Only rank 0 computes logits and samples.

A step message carries the batch plus the KV slots of every request in it (its rows of
the request-to-token table), so a rank needs no scheduler state of its own.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import zmq

from runtime import ipc
from runtime.distributed import check_tp_size, destroy_tensor_parallel, init_tensor_parallel
from runtime.executor.model_input import ForwardInput
from runtime.executor.worker import ModelWorker, prepare_process
from runtime.log_setup import configure_logging, set_log_level
from runtime.model_loader.weights import load_hf_config
from runtime.models.config import ModelConfig

if TYPE_CHECKING:
    from runtime.config import ServerArgs

_STOP_TIMEOUT_S = 10.0
_START_TIMEOUT_S = 120.0  # for every rank to run our code (spawn imports torch and the main module first)


logger = logging.getLogger("forkserve")

@dataclass
class TPStep:
    forward: ForwardInput  # what rank 0 runs
    row_slots: np.ndarray  # int64, each request's slots [0, seq_len), concatenated


@dataclass
class TPStop:
    pass


@dataclass
class TPLogLevel:
    level: str  # POST /configure_logging's log_level


class TPPeers:
    """Rank 0's handle on the other ranks: starts them, joins the process group with them,
    sends them each step, stops them."""

    def __init__(self, args: ServerArgs, model_dir: Path) -> None:
        size = args.tp_size
        init_method = f"tcp://127.0.0.1:{ipc.free_tcp_port()}"
        endpoints = ipc.new_ipc_names(size - 1)
        mp = multiprocessing.get_context("spawn")
        self.started = [mp.Event() for _ in range(1, size)]
        self.procs = [
            mp.Process(
                target=run_tp_worker_process,
                args=(args, str(model_dir), rank, init_method, endpoints[rank - 1], os.getpid(), self.started[rank - 1]),
                name=f"forkserve-tp{rank}",
            )
            for rank in range(1, size)
        ]
        for p in self.procs:
            p.start()
        self.zmq = zmq.Context()
        self.socks = [ipc.connect(self.zmq, zmq.PUSH, ep) for ep in endpoints]
        self.endpoints = endpoints
        self._wait_started()
        self.tp = init_tensor_parallel(0, size, init_method, args.resolved_device)

    def _wait_started(self, timeout: float = _START_TIMEOUT_S) -> None:
        """Wait until every rank runs our code; ``RuntimeError`` (the others stopped) if one
        exits first or does not get there in ``timeout`` s, rather than wait in the process
        group's rendezvous for a rank that will never come."""
        deadline = time.monotonic() + timeout
        while not all(e.is_set() for e in self.started):
            dead = [(rank, p.exitcode) for rank, p in enumerate(self.procs, 1) if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                for p in self.procs:
                    p.kill()
                    p.join(1.0)
                for sock in self.socks:
                    sock.close()
                self.zmq.term()
                ipc.remove_ipc_files(self.endpoints)
                if not dead:
                    raise RuntimeError(f"tensor-parallel ranks did not start in {timeout:.0f} s")
                raise RuntimeError(
                    f"tensor-parallel rank {dead[0][0]} exited (code {dead[0][1]}) before it started (its log above "
                    "says why). Ranks are processes started with multiprocessing's 'spawn', which imports the main "
                    "module again: a script that creates an Engine with tp_size > 1 needs its code under "
                    "`if __name__ == \"__main__\":`, the usual cause.")
            time.sleep(0.05)

    def send_step(self, fwd: ForwardInput, table: torch.Tensor) -> None:
        seq_lens = [p + e for p, e in zip(fwd.prefix_lens, fwd.extend_lens, strict=True)]
        slots = torch.cat([table[r, :n] for r, n in zip(fwd.rows.tolist(), seq_lens, strict=True)])
        cpu = ForwardInput(fwd.is_decode, fwd.rows.cpu(), fwd.input_ids.cpu(), fwd.positions.cpu(), fwd.prefix_lens,
                           fwd.extend_lens, fwd.out_cache_loc.cpu())
        frames = ipc.encode(TPStep(cpu, slots.cpu().numpy()))
        for sock in self.socks:
            sock.send_multipart(frames, copy=False)

    def set_log_level(self, level: str) -> None:
        for sock in self.socks:
            ipc.send(sock, TPLogLevel(level))

    def stop(self) -> None:
        for sock in self.socks:
            ipc.send(sock, TPStop())
        for p in self.procs:
            p.join(_STOP_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        destroy_tensor_parallel(self.tp)
        for sock in self.socks:
            sock.close()
        ipc.remove_ipc_files(self.endpoints)


def start_tp_peers(args: ServerArgs, model_dir: Path) -> TPPeers:
    """Ranks 1..N-1 for ``--tp-size N``, refused (``ValueError``) before any starts when the
    model's KV heads do not split N ways (the model checks again for its own TPInfo)."""
    check_tp_size(args.tp_size, ModelConfig.from_hf(load_hf_config(model_dir)).num_kv_heads)
    return TPPeers(args, model_dir)


def run_tp_worker_process(
    args: ServerArgs, model_dir: str, rank: int, init_method: str, endpoint: str, parent_pid: int, started: Any
) -> None:
    started.set()  # we got here: rank 0 may join the process group (TPPeers._wait_started)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0's process decides when we stop
    ipc.exit_with_parent(parent_pid, endpoints=[endpoint])  # rank 0's process stops without removing it
    configure_logging(f"tp rank {rank}", args.log_level)
    ctx = zmq.Context()
    sock = ipc.bind(ctx, zmq.PULL, endpoint)
    tp = init_tensor_parallel(rank, args.tp_size, init_method, args.resolved_device)
    prepare_process(args)
    worker = ModelWorker(args, Path(model_dir), tp=tp)
    table = worker.req_to_token.table
    with torch.inference_mode():
        while True:
            msg = ipc.recv(sock)
            if isinstance(msg, TPStop):
                break
            if isinstance(msg, TPLogLevel):
                set_log_level(msg.level)
                logger.info("log level set to %s", msg.level)
                continue
            fwd, offset = msg.forward, 0
            for r, p, e in zip(fwd.rows.tolist(), fwd.prefix_lens, fwd.extend_lens, strict=True):
                table[r, : p + e] = torch.from_numpy(msg.row_slots[offset : offset + p + e])
                offset += p + e
            worker.run_model(fwd)
    destroy_tensor_parallel(tp)
