"""The compute thread count under other processes' load (``runtime/executor/compute_threads.py``),
driven by made-up CPU clocks, and its premise: outputs do not depend on the thread count."""

from __future__ import annotations

import pytest
import torch

from runtime.executor.compute_threads import (
    WINDOW_S,
    ComputeThreads,
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
        machine.run(0, others=0)
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


def test_the_machines_busy_time_is_read_where_there_is_proc_stat():
    first = machine_busy_seconds()
    if first is None:  # not Linux
        return
    sum(i * i for i in range(200_000))
    assert machine_busy_seconds() >= first


@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_outputs_do_not_depend_on_the_thread_count(model_dir, dtype):
    """Switching threads mid-run changes speed only: greedy tokens and their logprobs on 1
    thread equal those on 2 (prefill, a chunked prefill and decode), with this machine's
    default dtype (bfloat16 on AVX512-BF16: the compiled layers on our GEMM) and float32."""
    from runtime.engine import Engine

    engine = Engine(str(model_dir), dtype=dtype, chunked_prefill_size=128)
    before = torch.get_num_threads()
    prompts = [[100 + 37 * i + j for j in range(120 + 40 * i)] for i in range(3)]
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    runs = []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            engine.flush_cache()
            out = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
            runs.append([(o["output_ids"], [lp[0] for lp in o["meta_info"]["output_token_logprobs"]]) for o in out])
    finally:
        torch.set_num_threads(before)
        engine.shutdown()
    assert runs[0] == runs[1]
