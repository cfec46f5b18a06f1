"""The compute thread count under other processes' load (``runtime/executor/compute_threads.py``),
driven by made-up CPU clocks, and its premise: outputs do not depend on the thread count."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
import torch

from runtime.executor.compute_threads import (
    WINDOW_S,
    ComputeThreads,
    adapts,
    available_cores,
    machine_busy_seconds,
    threads_for,
)


def test_threads_for_takes_a_core_from_six_tenths_and_gives_it_back_below_four_tenths():
    assert threads_for(0.0, 2, 2, 2) == 2
    assert threads_for(0.55, 2, 2, 2) == 2  # a busy client: keeps both
    assert threads_for(0.65, 2, 2, 2) == 1
    assert threads_for(0.5, 2, 2, 1) == 1  # between the marks: stays where it is
    assert threads_for(0.3, 2, 2, 1) == 2
    assert threads_for(3.0, 2, 2, 2) == 1  # never below one
    assert threads_for(2.7, 8, 8, 8) == 5
    assert threads_for(0.0, 8, 4, 4) == 4  # never above the most it was given


class FakeMachine:
    """CPU clocks that advance by hand: ``others`` cores busy besides this process's own."""

    def __init__(self) -> None:
        self.now = self.busy = self.own = 0.0

    def run(self, seconds: float, others: float, own: float = 2.0) -> None:
        self.now += seconds
        self.busy += seconds * (others + own)
        self.own += seconds * own


def test_two_windows_in_a_row_change_the_count_and_set_torchs():
    machine = FakeMachine()
    before = torch.get_num_threads()
    try:
        threads = ComputeThreads(2, 2, busy=lambda: machine.busy, own=lambda: machine.own, clock=lambda: machine.now)
        machine.run(WINDOW_S, others=1.0)
        assert threads.update() == 2  # one window is not enough
        machine.run(WINDOW_S / 2, others=1.0)
        assert threads.update() == 2  # nor part of one
        machine.run(WINDOW_S, others=0.1)
        assert threads.update() == 2  # a burst
        machine.run(WINDOW_S, others=0.8)
        threads.update()
        machine.run(WINDOW_S, others=0.9)
        assert threads.update() == 1 and torch.get_num_threads() == 1
        for _ in range(3):
            machine.run(WINDOW_S, others=1.0, own=1.0)
            assert threads.update() == 1
        machine.run(WINDOW_S, others=0.2, own=1.0)
        assert threads.update() == 1
        machine.run(WINDOW_S, others=0.2, own=1.0)
        assert threads.update() == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_unreadable_cpu_times_keep_the_count():
    machine = FakeMachine()
    threads = ComputeThreads(2, 2, busy=lambda: None, own=lambda: machine.own, clock=lambda: machine.now)
    for _ in range(4):
        machine.run(WINDOW_S, others=2.0)
        assert threads.update() == 2


def test_busy_time_counts_the_given_cores_once_each(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
    stat.write_text("cpu  300 0 30 900 9 0 3 6 200 0\n"
                    "cpu0 100 0 10 300 3 0 1 2 100 0\n"
                    "cpu1 200 0 20 600 6 0 2 4 100 0\n"
                    "intr 1 2 3\n")
    tick = os.sysconf("SC_CLK_TCK")
    assert machine_busy_seconds({0, 1}, str(stat)) * tick == pytest.approx(113 + 226)
    assert machine_busy_seconds({1}, str(stat)) * tick == pytest.approx(226)
    assert machine_busy_seconds({0}, str(tmp_path / "missing")) is None


def test_this_machines_busy_time_grows_with_this_processs_own_work():
    first, own = machine_busy_seconds(), time.process_time()
    if first is None:  # no /proc/stat here
        pytest.skip("no /proc/stat")
    while time.process_time() - own < 0.3:
        sum(i * i for i in range(10_000))
    assert machine_busy_seconds() - first >= 0.5 * (time.process_time() - own)


def test_only_an_unpinned_server_worker_with_the_compiled_layers_adapts(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    args = SimpleNamespace(resolved_device="cpu", num_threads=None)
    worker = SimpleNamespace(tp=SimpleNamespace(size=1), model=SimpleNamespace(compiled_layers=object()))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(min(2, available_cores()))
        can = torch.get_num_threads() > 1
        assert adapts(args, worker) == can
        assert not adapts(SimpleNamespace(resolved_device="cpu", num_threads=2), worker)
        assert not adapts(SimpleNamespace(resolved_device="cuda", num_threads=None), worker)
        assert not adapts(args, SimpleNamespace(tp=SimpleNamespace(size=2), model=worker.model))
        assert not adapts(args, SimpleNamespace(tp=worker.tp, model=SimpleNamespace(compiled_layers=None)))
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert not adapts(args, worker)
        monkeypatch.delenv("OMP_NUM_THREADS")
        torch.set_num_threads(available_cores() + 1)  # more threads than cores: asked for
        assert not adapts(args, worker)
    finally:
        torch.set_num_threads(before)


class SwitchEveryStep:
    """Stands in for the worker's ComputeThreads: sets the counts in turn, one per step, on the
    thread that steps, and records the count each step ran with."""

    def __init__(self, counts: list[int]) -> None:
        self.counts, self.seen = counts, []

    def update(self) -> int:
        torch.set_num_threads(self.counts[len(self.seen) % len(self.counts)])
        self.seen.append(torch.get_num_threads())
        return self.seen[-1]


def test_outputs_do_not_depend_on_the_thread_count(model_dir):
    """Switching threads mid-run changes speed only: greedy tokens and their logprobs with
    the count switched between 1 and 2 every step equal those on 2 throughout (prefill, a
    chunked prefill, decode), with this machine's default dtype on the compiled layers."""
    from runtime.engine import Engine

    engine = Engine(str(model_dir), chunked_prefill_size=128)
    if engine.worker.model.compiled_layers is None:
        engine.shutdown()
        pytest.skip("the compiled decoder layers are not used here")
    prompts = [[100 + 37 * i + j for j in range(120 + 40 * i)] for i in range(3)]
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    runs = []
    try:
        for counts in ([2], [1, 2]):
            engine.worker.compute_threads = switch = SwitchEveryStep(counts)
            engine.flush_cache()
            out = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
            runs.append([(o["output_ids"], [lp[0] for lp in o["meta_info"]["output_token_logprobs"]]) for o in out])
            assert set(switch.seen) == set(counts)
    finally:
        engine.worker.compute_threads = SwitchEveryStep([2])
        engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 1})  # the stepping thread back on 2
        engine.shutdown()
    assert runs[0] == runs[1]
