"""The streaming side of a program state (``run(..., stream=True)``): the executor emits
each piece of text as it is produced, tagged with the variables it is part of, and
``text_iter`` / ``text_async_iter`` hand the pieces to a reader on another thread."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from frontend_lang.state import Program


class StreamedText:
    # ProgramState's, used here
    program: Program
    meta_info: dict[str, Any]
    scope_starts: dict[str, int]
    _cond: threading.Condition
    # (the variables the text is part of, text, whether it is part of the program's text:
    # separated reasoning is not); text None: that variable is complete
    _chunks: list[tuple[tuple[str, ...], str | None, bool]]
    _finished: bool

    def text(self) -> str:
        raise NotImplementedError

    def __getitem__(self, name: str) -> Any:
        raise NotImplementedError

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is produced until the program ends, or only ``var_name``'s until that
        variable is complete (as SGLang's). Without ``run(..., stream=True)``: all of it at
        once (as SGLang gives it)."""
        if not self.program.stream:
            yield self.text() if var_name is None else self[var_name]
            return
        i = 0
        while True:
            with self._cond:
                while i >= len(self._chunks) and not self._finished and not self.program.interrupted:
                    self._wait()
                chunks, done = self._chunks[i:], self._finished or self.program.interrupted
            i += len(chunks)
            for names, text, in_text in chunks:
                if var_name is not None and text is None and var_name in names:
                    return
                if text and (in_text if var_name is None else var_name in names):
                    yield text
            if done and i >= len(self._chunks):  # a failure ended it: error() says what (as in SGLang)
                return


    async def text_async_iter(self, var_name: str | None = None, return_meta_data: bool = False) -> AsyncIterator[Any]:
        """``text_iter`` for asyncio. With ``return_meta_data`` (and ``var_name``), each chunk
        comes as ``(text, meta_info)``: the variable's meta info as it stands when the chunk is
        read (while the gen runs, its latest update: ``finish_reason`` None and the tokens so
        far; complete once the gen is; None before its first update)."""
        import asyncio

        it = self.text_iter(var_name)
        done = object()
        while True:
            chunk = await asyncio.to_thread(next, it, done)
            if chunk is done:
                return
            yield (chunk, self.meta_info.get(var_name)) if return_meta_data and var_name else chunk


    def _emit(self, var: str | None, text: str | None, in_text: bool = True) -> None:
        if not self.program.stream or not (text or text is None and var is not None):
            return
        # text is part of its variable and of every var_scope open around it
        names = (var,) if text is None or not in_text else ((var,) if var else ()) + tuple(self.scope_starts)
        with self._cond:
            self._chunks.append((names, text, in_text))  # type: ignore[arg-type]
            self._cond.notify_all()


    def mark_finished(self) -> None:
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def _wait(self) -> None:
        """Wait for the executor (``_cond`` held); Ctrl-C meanwhile interrupts the program
        (a streamed run's body runs on a thread of its own, so only its reader sees it)."""
        try:
            self._cond.wait()
        except KeyboardInterrupt:
            self._cond.release()  # interrupt() takes every state's lock, this one's too
            try:
                self.program.interrupt()
            finally:
                self._cond.acquire()
            raise
