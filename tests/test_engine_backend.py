"""The DSL's in-process backend on a shared ``runtime.Engine``: several backends and direct
``engine.generate`` calls from other threads at once each get their own answers, shutdown
by the engine's owner ends it for all, and an engine failure answers every caller."""

from __future__ import annotations

import threading

import pytest

import frontend_lang as sgl
from runtime.engine import Engine

pytestmark = pytest.mark.slow


@sgl.function
def short(s, word):
    s += word + sgl.gen("x", max_tokens=3, ignore_eos=True)


def test_a_raw_engine_given_on_every_run_is_wrapped_once(tiny_gqa_llama):
    engine = Engine(str(tiny_gqa_llama), dtype="float32")
    try:
        for _ in range(2):
            states = short.run_batch([("a",), ("b",), ("c",), ("d",)], temperature=0, backend=engine)
            assert [st.error() for st in states] == [None] * 4
        assert sgl.program._as_backend(engine) is sgl.program._as_backend(engine)
    finally:
        engine.shutdown()


def test_backends_and_direct_calls_share_one_engine(tiny_gqa_llama):
    """Programs on two ``EngineBackend``s and ``engine.generate`` from another thread, all at
    once (the DSL's own stepping thread used to step the engine beside a direct call's): each
    gets its answers alone; one backend's shutdown leaves the engine to the others."""
    engine = Engine(str(tiny_gqa_llama), dtype="float32")
    try:
        first, second = sgl.EngineBackend(engine), sgl.EngineBackend(engine)
        alone = [st["x"] for st in short.run_batch([("a",), ("b",)], temperature=0, backend=first)]
        direct_alone = engine.generate("Hello", {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})["text"]
        results: dict[str, list] = {}

        def run(name: str, backend: sgl.EngineBackend) -> None:
            results[name] = short.run_batch([("a",), ("b",)] * 3, temperature=0, backend=backend)

        def direct() -> None:
            results["direct"] = [engine.generate("Hello", {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})["text"]
                                 for _ in range(3)]

        threads = [threading.Thread(target=run, args=(n, b)) for n, b in (("1", first), ("2", second))]
        threads.append(threading.Thread(target=direct))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results["direct"] == [direct_alone] * 3
        for name in ("1", "2"):
            assert [st.error() for st in results[name]] == [None] * 6
            assert [st["x"] for st in results[name]] == alone * 3
        first.shutdown()
        with pytest.raises(sgl.BackendError, match="shut down"):
            first.generate("Hi", {"max_new_tokens": 1})
        assert second.generate("Hi", {"max_new_tokens": 2, "ignore_eos": True})["meta_info"]["completion_tokens"] == 2
        second.shutdown()
        assert not engine.has_work
        engine.scheduler.check_invariants()
    finally:
        engine.shutdown()


def test_the_backend_that_started_the_engine_stops_it_for_all(tiny_gqa_llama):
    owner = sgl.EngineBackend(model_path=str(tiny_gqa_llama), dtype="float32")
    guest = sgl.EngineBackend(owner.engine)
    owner.shutdown()
    with pytest.raises(sgl.BackendError, match="shut down"):
        guest.generate("Hi", {"max_new_tokens": 1})
    with pytest.raises(sgl.BackendError, match="shut down"):
        sgl.EngineBackend(owner.engine)
    guest.shutdown()


def test_an_engine_failure_answers_every_call_then_and_later(tiny_gqa_llama):
    """A step that raises fails the calls in flight, whichever thread ran it; the program
    still returns and later calls fail at once."""
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
        with pytest.raises(sgl.BackendError, match="injected step failure"):
            sgl.EngineBackend(backend.engine)
        with pytest.raises(RuntimeError, match="injected step failure"):
            backend.engine.generate("Hi", {"max_new_tokens": 1})
    finally:
        backend.shutdown()
