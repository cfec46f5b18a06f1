"""Per-call timing, measured on the client side the same way for every driver.

``RecordingBackend`` wraps any DSL backend: each ``gen`` (with tools too) becomes a streamed request whose
chunks are timestamped as they arrive (time to first token, inter-token gaps), and each
result's ``meta_info`` gives the prompt, cached and completion token counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench_agent.drivers.streaming import StreamingBackend
from frontend_lang.backend.base import Backend
from frontend_lang.tools import RenderedChat, ToolUse


@dataclass
class CallRecord:
    program: int
    kind: str  # "gen", or "prefill" for a fork's shared prefix sent ahead
    start: float
    end: float = 0.0
    first_token: float | None = None
    # the gap before each output token after the first; a chunk of k tokens arriving
    # after a gap g counts as k gaps of g / k
    itls: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # None: the server does not report it
    completion_tokens: int = 0
    max_new_tokens: int = 0


def tokens_so_far(chunk: dict[str, Any]) -> int:
    """Output tokens in a streamed (cumulative) chunk. A chunk marked ``final`` only
    carries the exact totals of a stream whose chunks were counted one token each; its
    arrival is not a token's."""
    if "output_ids" in chunk:
        return len(chunk["output_ids"])
    return int(chunk.get("meta_info", {}).get("completion_tokens", 0))


class CallLog:
    """The records of one run; shared by the recording backends of all its programs."""

    def __init__(self) -> None:
        self.records: list[CallRecord] = []
        self._lock = threading.Lock()

    def add(self, record: CallRecord) -> None:
        with self._lock:
            self.records.append(record)


class RecordingBackend(StreamingBackend):
    def __init__(self, inner: Backend, log: CallLog, program: int) -> None:
        self.inner, self.log, self.program = inner, log, program
        self.can_cache_prefix = inner.can_cache_prefix

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], *, program_id: str | None = None
    ) -> Iterator[dict[str, Any]]:
        yield from self._timed(sampling_params, self.inner.generate_stream(prompt, sampling_params, program_id=program_id))

    def generate_chat(
        self, messages: list[dict[str, Any]], sampling_params: dict[str, Any], tools: ToolUse | None, *,
        program_id: str | None = None, stream: bool = False,
    ) -> Iterator[dict[str, Any]]:
        chunks = self.inner.generate_chat(messages, sampling_params, tools, program_id=program_id, stream=True)
        yield from self._timed(sampling_params, chunks)

    def _timed(self, sampling_params: dict[str, Any], chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        rec = CallRecord(self.program, "gen", time.perf_counter())
        rec.max_new_tokens = int(sampling_params.get("max_new_tokens", 0))
        seen, last = 0, rec.start
        chunk: dict[str, Any] = {}
        for chunk in chunks:
            now, n = time.perf_counter(), tokens_so_far(chunk)
            if n > seen and not chunk.get("final"):
                if rec.first_token is None:
                    rec.first_token = now  # the wait for the first chunk is the TTFT
                else:
                    rec.itls += [(now - last) / (n - seen)] * (n - seen)
                seen, last = n, now
            yield chunk
        self._finish(rec, chunk)

    def cache_prefix(self, prompt: str, program_id: str | None = None) -> dict[str, Any]:
        rec = CallRecord(self.program, "prefill", time.perf_counter())
        out = self.inner.cache_prefix(prompt, program_id)
        self._finish(rec, out)
        return out

    def _finish(self, rec: CallRecord, out: dict[str, Any]) -> None:
        rec.end = time.perf_counter()
        meta = out.get("meta_info", {})
        rec.prompt_tokens = int(meta.get("prompt_tokens", 0))
        cached = meta.get("cached_tokens")
        rec.cached_tokens = None if cached is None else int(cached)
        rec.completion_tokens = int(meta.get("completion_tokens", tokens_so_far(out)))
        self.log.add(rec)

    def role_markers(self) -> dict[str, Any]:
        return self.inner.role_markers()

    def chat_prompt(self, messages: list[dict[str, Any]], tools: ToolUse | None,
                    add_generation_prompt: bool = True) -> RenderedChat:
        return self.inner.chat_prompt(messages, tools, add_generation_prompt)

    def chat_text(self, messages: list[dict[str, Any]], tools: ToolUse | None) -> str:
        return self.inner.chat_text(messages, tools)

    def end_program(self, program_id: str) -> None:
        self.inner.end_program(program_id)
