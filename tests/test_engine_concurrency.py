"""The offline ``Engine`` used by several callers at once: streams, threads sharing one
engine, and Ctrl-C during ``generate``; the answers must stay those of a lone call."""

from __future__ import annotations

import itertools
import time

import pytest

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0}


@pytest.fixture
def step_count(engine, monkeypatch):
    """The engine's core counts its steps during the test: ``step_count()`` so far."""
    steps = 0
    step = engine.core.step

    def counted_step():
        nonlocal steps
        steps += 1
        return step()

    monkeypatch.setattr(engine.core, "step", counted_step)
    return lambda: steps


def test_stream_grows_to_the_non_streamed_output(engine, chat_prompt):
    """SGLang's ``Engine.generate(stream=True)``: outputs whose text only grows, never shows a
    stop string's start before the end, and ends in the non-streamed output."""
    params = {**GREEDY, "max_new_tokens": 24, "stop": "4."}
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Count from 1 to 9."}])
    whole = engine.generate(prompt, params)
    chunks = list(engine.generate(prompt, params, stream=True))

    def same(out: dict) -> dict:  # the second run has its own id and time, and finds the prompt cached
        return {**out, "meta_info": {k: v for k, v in out["meta_info"].items() if k not in ("cached_tokens", "e2e_latency", "id")}}

    assert whole["meta_info"]["finish_reason"] == {"type": "stop", "matched": "4."}
    assert len(chunks) > 3 and same(chunks[-1]) == same(whole)
    texts = [c["text"] for c in chunks]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
    assert not any("4" in t for t in texts)  # "4" may start the stop string: held back
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == sorted(c["meta_info"]["completion_tokens"] for c in chunks)


def test_a_streamed_batch_tags_outputs_with_their_index_and_closing_early_aborts(engine, chat_prompt, ref):
    prompts = [chat_prompt, engine.tokenizer.apply_chat_template([{"role": "user", "content": "Name a color."}])]
    last: dict[int, dict] = {}
    for chunk in engine.generate(prompts, {**GREEDY, "max_new_tokens": 12}, stream=True):
        last[chunk["index"]] = chunk
    assert last[0]["output_ids"] == ref["output_ids"][:12] and last[0]["meta_info"]["finish_reason"] is not None
    assert last[1]["meta_info"]["finish_reason"] is not None
    stream = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 64, "ignore_eos": True}, stream=True)
    next(stream)
    stream.close()  # the consumer stops: the request must not stay in the engine
    assert not engine.has_work
    never_read = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 64}, stream=True)
    assert engine.has_work
    del never_read  # dropped before its first output: aborted all the same
    assert not engine.has_work


def test_streams_and_generate_calls_may_interleave(engine, chat_prompt, ref):
    """Whoever steps the engine, each stream sees its own request through: a ``generate``
    between two chunks runs the stream's request too (it used to wait for an output that
    call had taken, forever), and two streams read in turns both end."""
    params = {**GREEDY, "max_new_tokens": 12}
    stream = engine.generate(chat_prompt, {**params, "ignore_eos": True}, stream=True)
    next(stream)
    assert engine.generate(chat_prompt, params)["output_ids"] == ref["output_ids"][:12]
    rest = list(stream)
    assert rest and rest[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    streams = [engine.generate(chat_prompt, params, stream=True), engine.generate("Hello", params, stream=True)]
    last: list[dict] = [{}, {}]
    while streams[0] is not None or streams[1] is not None:  # one chunk of each in turn
        for k, s in enumerate(streams):
            if s is not None:
                chunk = next(s, None)
                streams[k] = None if chunk is None else s
                last[k] = chunk or last[k]
    assert last[0]["output_ids"] == ref["output_ids"][:12]
    assert all(out["meta_info"]["finish_reason"] is not None for out in last)
    assert not engine.scheduler.has_work


def test_threads_may_share_an_engine(engine, chat_prompt, ref):
    """Eight threads calling generate at once got 'forward contexts do not nest' and leaked
    KV slots; each now gets the answer it gets alone."""
    import threading

    answers: list[dict] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            answers.append(engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 16}))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and [a["output_ids"] for a in answers] == [ref["output_ids"]] * 8
    engine.scheduler.check_invariants()
    assert engine.scheduler.stats()["kv_held_by_requests"] == 0


def test_threads_requests_share_batches(engine, chat_prompt, step_count):
    """A caller queues without waiting for the step in progress, and its request joins the
    next one. The stepping thread used to take the lock back first: 8 threads x 32 tokens
    took 58 steps instead of about 33."""
    import threading

    params = {**GREEDY, "max_new_tokens": 24, "ignore_eos": True}
    answers: list[list[int]] = []
    threads = [threading.Thread(target=lambda: answers.append(engine.generate(chat_prompt, params)["output_ids"]))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(answers) == 8 and all(a == answers[0] for a in answers)
    assert step_count() <= 24 + 2, f"{step_count()} steps for 8 requests of 24 tokens"


def test_ctrl_c_during_generate_aborts_its_requests_and_the_engine_goes_on(engine, chat_prompt, ref, ctrl_c):
    """An interrupt mid-step left the core half-way through its bookkeeping (KV slots
    leaked; later a tree insert short of its slots). The engine's own thread steps, so the
    interrupt reaches the waiting call; the step ends, and the call's requests are aborted
    before the next one but one."""
    import _thread

    step = engine.core.step
    for at_step in (1, 3, 7):  # Ctrl-C arrives during that step (as from a terminal: Python's handler)
        steps = [0]

        def interrupted_step(at_step: int = at_step, steps: list[int] = steps):
            steps[0] += 1
            if steps[0] == at_step:
                _thread.interrupt_main()
            return step()

        engine.core.step = interrupted_step
        try:
            with pytest.raises(KeyboardInterrupt):
                engine.generate([chat_prompt] * 8, {**GREEDY, "max_new_tokens": 200, "ignore_eos": True})
        finally:
            del engine.core.step
        assert at_step <= steps[0] <= at_step + 1  # aborted at once, not at the end of the call
        assert not engine.scheduler.has_work
        engine.scheduler.check_invariants()
        assert engine.scheduler.stats()["kv_held_by_requests"] == 0
    assert engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 16})["output_ids"] == ref["output_ids"]


def test_a_call_that_would_wait_for_a_step_inside_between_steps_says_so(engine, chat_prompt):
    """``between_steps`` holds the steps back: a generate inside it hung for ever."""
    with pytest.raises(RuntimeError, match="between_steps"):
        engine.between_steps(lambda: engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 2}))
    assert engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


def _assert_idle_and_clean(engine) -> None:
    deadline = time.monotonic() + 30
    while engine.has_work and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.has_work
    engine.between_steps(engine.scheduler.check_invariants)
    assert engine.scheduler.stats()["kv_held_by_requests"] == 0


def test_a_second_ctrl_c_while_the_first_ones_abort_waits_still_aborts(engine, chat_prompt, ref, ctrl_c):
    """The first Ctrl-C's abort waits for the step in progress; a second one there cut the
    abort short and the call's requests ran to their end."""
    import signal

    step = engine.core.step
    steps = [0]

    def slow_interrupted_step():
        steps[0] += 1
        if steps[0] == 2:
            signal.pthread_kill(ctrl_c, signal.SIGINT)
            time.sleep(0.3)  # the first interrupt's abort now waits for this step
            signal.pthread_kill(ctrl_c, signal.SIGINT)
            time.sleep(0.3)
        return step()

    engine.core.step = slow_interrupted_step
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.generate([chat_prompt] * 4, {**GREEDY, "max_new_tokens": 200, "ignore_eos": True})
    finally:
        del engine.core.step
    assert not engine.has_work  # aborted before the call returned
    assert steps[0] <= 3
    _assert_idle_and_clean(engine)
    assert engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 16})["output_ids"] == ref["output_ids"]


def test_leaving_a_with_block_of_a_stream_aborts_it(engine, chat_prompt):
    """Ctrl-C in a ``for chunk in stream`` body leaves the stream referenced by the
    traceback: its requests ran on. Leaving the ``with`` block ends them."""
    params = {**GREEDY, "max_new_tokens": 200, "ignore_eos": True}
    with pytest.raises(KeyboardInterrupt), engine.generate(chat_prompt, params, stream=True) as stream:
        for _chunk in stream:
            raise KeyboardInterrupt  # as Ctrl-C in the loop's body
    assert not engine.has_work


def test_a_stream_dropped_inside_a_step_is_aborted_after_it(engine, chat_prompt, ref, monkeypatch):
    """The garbage collector may finalize a dropped stream on the stepping thread in the
    middle of a step (here: while the model runs): its abort ran there, changing the core
    under the step. It runs after the step."""
    held = [engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 200, "ignore_eos": True}, stream=True)]
    next(held[0])
    req = held[0]._reqs[0]
    run = engine.worker.run
    finished_mid_step = []

    def run_and_drop(inp):
        if held:
            held.clear()  # the last reference: finalized here, on the stepping thread
            finished_mid_step.append(req.is_finished)
        return run(inp)

    monkeypatch.setattr(engine.worker, "run", run_and_drop)
    assert engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 16})["output_ids"] == ref["output_ids"]
    assert finished_mid_step == [False] and req.finished_reason["type"] == "abort"
    _assert_idle_and_clean(engine)


def test_a_stream_dropped_while_its_thread_queues_does_not_deadlock(tiny_gqa_llama, chat_prompt):
    """The collector may also run on a caller's thread while it queues requests (under the
    inbox lock, which was not re-entrant): the abort took the inbox, waiting for that very
    lock, for good."""
    import threading

    from runtime.engine import Engine

    eng = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=4000)
    held = [eng.generate(chat_prompt, {**GREEDY, "max_new_tokens": 200, "ignore_eos": True}, stream=True)]
    next(held[0])

    def drop_while_queueing() -> None:
        with eng._steps._inbox_lock:  # as inside ``queue``, where the collector may run
            held.clear()

    dropper = threading.Thread(target=drop_while_queueing, daemon=True)
    dropper.start()
    dropper.join(5)
    assert not dropper.is_alive(), "deadlocked"  # (the engine is left as it is: its shutdown would hang)
    _assert_idle_and_clean(eng)
    eng.shutdown()
    # its stepping thread has ended: it ran on after shutdown, and where it held the engine's last
    # reference, freed the model while the interpreter exited ("terminate called", exit code 134)
    assert not eng._steps._thread.is_alive()


def test_stream_chunks_describe_the_tokens_they_carry(engine, chat_prompt, monkeypatch):
    """A chunk's ``meta_info`` was read live while the next step appended: a token more than
    its ``output_ids`` (and a finish reason) could show. A slow decode makes that likely."""
    decode = engine.tokenizer.decode

    def slow_decode(*args, **kwargs):
        time.sleep(0.03)
        return decode(*args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "decode", slow_decode)
    chunks = list(engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 12, "ignore_eos": True}, stream=True,
                                  return_logprob=True))
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    for c in chunks[:-1]:
        meta, n = c["meta_info"], len(c["output_ids"])
        assert (meta["completion_tokens"], len(meta["output_token_logprobs"]), meta["finish_reason"]) == (n, n, None)


def test_cancelling_async_generate_aborts_its_requests(engine, chat_prompt, step_count):
    """More calls than asyncio's default thread pool has threads (min(32, cores + 4)): the
    aborts queued behind the calls that held the pool's threads, which ran to their end."""
    import asyncio
    import os


    async def cancel_midway() -> None:
        tasks = [asyncio.create_task(engine.async_generate(chat_prompt, {**GREEDY, "max_new_tokens": 500,
                                                                         "ignore_eos": True}))
                 for _ in range(min(32, (os.cpu_count() or 1) + 4) + 2)]
        while not engine.has_work:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        at_cancel = step_count()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with pytest.raises(asyncio.CancelledError):
                await task
        assert not engine.has_work  # (``asyncio.run`` waits for its worker threads at the end)
        assert step_count() - at_cancel < 50  # not the ~500 of running to the end

    asyncio.run(cancel_midway())
    _assert_idle_and_clean(engine)


def test_an_abort_inside_between_steps_is_done_there(engine, chat_prompt):
    """Between steps the core is the caller's: an abort there is done at once, not left for
    the stepping thread (a flush_cache right after was refused)."""
    stream = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 200, "ignore_eos": True}, stream=True)
    next(stream)
    reqs = stream._reqs
    engine.between_steps(lambda: engine.abort_unfinished(reqs))
    assert all(r.is_finished for r in reqs) and not engine.has_work
    assert engine.flush_cache()
