"""The DSL's in-process driver: one thread steps an engine however many backends share it
(two stepped it at once and broke it), and an engine failure answers every caller."""

from __future__ import annotations

import threading
import time

import pytest

import frontend_lang as sgl
from runtime.engine import Engine

pytestmark = pytest.mark.slow


def _drivers() -> int:
    return sum(t.name == "forkserve-engine-driver" for t in threading.enumerate())


@sgl.function
def short(s, word):
    s += word + sgl.gen("x", max_tokens=3, ignore_eos=True)


def test_a_raw_engine_given_on_every_run_gets_one_driver(tiny_gqa_llama):
    """``run(backend=engine)`` wraps the engine once: a driver per run stepped it from
    several threads at once and broke it."""
    engine, before = Engine(str(tiny_gqa_llama), dtype="float32"), _drivers()
    try:
        for _ in range(2):
            states = short.run_batch([("a",), ("b",), ("c",), ("d",)], temperature=0, backend=engine)
            assert [st.error() for st in states] == [None] * 4
        assert _drivers() == before + 1
    finally:
        sgl.program._as_backend(engine).shutdown()
        engine.shutdown()


def test_backends_built_by_hand_on_one_engine_share_its_driver(tiny_gqa_llama):
    """Two ``EngineBackend``s on one engine, programs on both at once: one driver steps it,
    each gets its own answers (the same as alone), and the driver outlives the first
    shutdown but not the last."""
    engine, before = Engine(str(tiny_gqa_llama), dtype="float32"), _drivers()
    try:
        first, second = sgl.EngineBackend(engine), sgl.EngineBackend(engine)
        assert _drivers() == before + 1
        alone = [st["x"] for st in short.run_batch([("a",), ("b",)], temperature=0, backend=first)]
        results: dict[str, list] = {}

        def run(name: str, backend: sgl.EngineBackend) -> None:
            results[name] = short.run_batch([("a",), ("b",)] * 3, temperature=0, backend=backend)

        threads = [threading.Thread(target=run, args=(n, b)) for n, b in (("1", first), ("2", second))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for states in results.values():
            assert [st.error() for st in states] == [None] * 6
            assert [st["x"] for st in states] == alone * 3
        first.shutdown()
        with pytest.raises(sgl.BackendError, match="shut down"):
            first.generate("Hi", {"max_new_tokens": 1})
        assert second.generate("Hi", {"max_new_tokens": 2, "ignore_eos": True})["meta_info"]["completion_tokens"] == 2
        second.shutdown()
        assert _drivers() == before
    finally:
        engine.shutdown()


def test_a_new_backend_waits_for_the_stopping_driver(tiny_gqa_llama):
    """The last backend's shutdown stops its driver while a step runs; a backend attached
    meanwhile gets a new driver only once the old one is gone (before, both stepped the
    engine at once), and the old driver's unanswered request leaves the engine."""
    engine = Engine(str(tiny_gqa_llama), dtype="float32")
    core, real_step = engine.core, engine.core.step
    inside, overlapped, stepping = [0], [], threading.Event()

    def slow_step():
        inside[0] += 1
        overlapped.append(inside[0] > 1)
        stepping.set()
        time.sleep(0.2)
        try:
            return real_step()
        finally:
            inside[0] -= 1

    core.step = slow_step
    first, outcome = sgl.EngineBackend(engine), []

    def long_call() -> None:
        try:
            first.generate("Hi", {"max_new_tokens": 40, "ignore_eos": True})
        except sgl.BackendError as err:
            outcome.append(err)

    caller = threading.Thread(target=long_call)
    caller.start()
    try:
        assert stepping.wait(30)
        stopper = threading.Thread(target=first.shutdown)
        stopper.start()
        time.sleep(0.05)  # the old driver is stopping, inside its step
        second = sgl.EngineBackend(engine)
        out = second.generate("Hello", {"max_new_tokens": 3, "ignore_eos": True})
        stopper.join(30)
        caller.join(30)
        assert out["meta_info"]["completion_tokens"] == 3
        assert not any(overlapped), "two drivers stepped the engine at once"
        assert len(outcome) == 1 and "shut down" in str(outcome[0])
        sched = engine.core.scheduler
        assert second.run_in_driver(lambda: len(sched.running) + len(sched.waiting)) == 0
        second.shutdown()
    finally:
        engine.shutdown()


def test_the_backend_that_started_the_engine_stops_it_for_all(tiny_gqa_llama):
    owner = sgl.EngineBackend(model_path=str(tiny_gqa_llama), dtype="float32")
    guest = sgl.EngineBackend(owner.engine)
    owner.shutdown()
    with pytest.raises(sgl.BackendError, match="shut down"):
        guest.generate("Hi", {"max_new_tokens": 1})
    guest.shutdown()


def test_an_engine_failure_answers_every_call_then_and_later(tiny_gqa_llama):
    """A step that raises fails the calls in flight; the program still returns (its pins'
    release is answered, not left waiting on a stopped driver) and later calls fail at once."""
    backend = sgl.EngineBackend(model_path=str(tiny_gqa_llama), dtype="float32")
    core = backend.engine.core
    real_step = core.step

    def failing_step():
        if any(len(r.output_ids) >= 2 for r in core.scheduler.running):
            raise RuntimeError("injected step failure")
        return real_step()

    core.step = failing_step

    @sgl.function
    def fan(s):
        s += "Hello there, how are you today?"
        branches = s.fork(3)
        branches += sgl.gen("x", max_tokens=20, ignore_eos=True)
        branches.join()

    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            outcome.append(fan.run(temperature=0, backend=backend).error())
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            outcome.append(err)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(60)
    try:
        assert not runner.is_alive(), "the program hung after the engine failed"
        assert len(outcome) == 1 and "injected step failure" in str(outcome[0])
        with pytest.raises(sgl.BackendError, match="injected step failure"):
            backend.generate("Hi", {"max_new_tokens": 1})
        with pytest.raises(sgl.BackendError, match="injected step failure"):
            backend.end_program("any")
        with pytest.raises(sgl.BackendError, match="injected step failure"):  # no new driver on it
            sgl.EngineBackend(backend.engine)
    finally:
        backend.shutdown()
