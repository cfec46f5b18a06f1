"""Programs run with ``stream=True``: ``text_iter`` / ``text_async_iter`` give the text as it
is made (in process and over HTTP), a variable's iterator ends with that variable, reads
wait for the program, and a stream cut off keeps what its reader was shown."""

from __future__ import annotations

import asyncio

import pytest

import frontend_lang as sgl

pytestmark = pytest.mark.slow


def test_a_streamed_runs_variables_wait_for_the_program(local):
    @sgl.function
    def two(s):
        s += "Count:" + sgl.gen("a", max_tokens=4, ignore_eos=True) + sgl.gen("b", max_tokens=4, ignore_eos=True)

    state = two.run(stream=True, temperature=0, backend=local)
    assert state["a"] and state["b"] and state.text().startswith("Count:")  # no KeyError while it runs


@pytest.mark.parametrize("which", ["local", "remote"])
def test_streaming_text_iter(which, request):
    backend = request.getfixturevalue(which)

    @sgl.function
    def story(s):
        s += "Once upon a time" + sgl.gen("story", max_tokens=12, ignore_eos=True) + "."

    state = story.run(temperature=0, backend=backend, stream=True)
    pieces = list(state.text_iter())
    assert len(pieces) >= 3
    assert "".join(pieces) == state.text()
    state2 = story.run(temperature=0, backend=backend, stream=True)

    async def collect() -> list[str]:
        return [p async for p in state2.text_async_iter("story")]

    assert "".join(asyncio.run(collect())) == state2["story"]


def test_a_stream_cut_off_keeps_what_its_reader_was_shown(engine):
    """SGLang appends a streamed gen's text as it comes: a stream that breaks (the server
    gone) leaves that text in ``text()`` and the variable, and the error in ``error()``."""
    class CutBackend(sgl.EngineBackend):
        cut_at = 3  # chunks

        def generate_stream(self, *args, **kwargs):
            for k, out in enumerate(super().generate_stream(*args, **kwargs)):
                if k == self.cut_at:
                    raise sgl.BackendError("the server went away")
                yield out

    @sgl.function
    def story(s):
        s += "Once upon a time" + sgl.gen("story", max_tokens=40, ignore_eos=True) + "."

    state = story.run(temperature=0, backend=CutBackend(engine), stream=True)
    shown = "".join(state.text_iter())
    assert "went away" in str(state.error())
    assert shown.startswith("Once upon a time") and len(shown) > len("Once upon a time")
    assert state.text() == shown and state["story"] == shown.removeprefix("Once upon a time")

    @sgl.function
    def twice(s):  # the second gen of the name breaks before its first chunk
        s += "One" + sgl.gen("x", max_tokens=2, ignore_eos=True) + sgl.gen("x", max_tokens=4)

    class CutSecond(CutBackend):
        calls = 0

        def generate_stream(self, *args, **kwargs):
            self.calls += 1
            self.cut_at = 3 if self.calls == 1 else 0
            yield from super().generate_stream(*args, **kwargs)

    state = twice.run(temperature=0, backend=CutSecond(engine), stream=True)
    list(state.text_iter())
    assert "went away" in str(state.error()) and state["x"] == ""
    assert state.meta_info.get("x") is None  # not the first gen's


def test_a_variables_text_iter_ends_with_the_variable(local):
    """``text_iter("a")`` ends when ``a`` is complete, as SGLang's does, while the program
    goes on (it waited for the whole program)."""
    import threading

    go_on = threading.Event()

    @sgl.function
    def two(s):
        s += "Count:" + sgl.gen("a", max_tokens=4, ignore_eos=True)
        go_on.wait(60)
        s += sgl.gen("b", max_tokens=2, ignore_eos=True)

    state = two.run(stream=True, temperature=0, backend=local)
    pieces: list[str] = []
    reader = threading.Thread(target=lambda: pieces.extend(state.text_iter("a")), daemon=True)
    reader.start()
    reader.join(30)
    finished_first = not reader.is_alive()
    go_on.set()
    assert finished_first, "text_iter('a') waited for the rest of the program"
    assert "".join(pieces) == state["a"] and "".join(state.text_iter("b")) == state["b"]
