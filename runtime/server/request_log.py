"""``--log-requests``: a line when a generation request reaches the scheduler and one when it
ends, written by the HTTP process's ``SchedulerClient`` (so every route is covered, and the
requests a ``/generate`` batch or ``n`` expands into are each one). ``/configure_logging``
changes the settings while serving. The lines are written whatever ``--log-level`` says (they
were asked for); in JSON, each line is the object alone. What a line holds grows with the level:

- 0: request id, prompt tokens; at the end the finish reason (or error), cached and
  completion tokens, seconds to the first token (streamed requests) and in all;
- 1: also the sampling parameters that differ from their defaults;
- 2: also the prompt and output text, each cut to its first and last 1,000 characters;
- 3: all of the text.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.sampling.params import SamplingParams

if TYPE_CHECKING:
    from runtime.server.scheduler_client import ReqState

logger = logging.getLogger("forkserve.requests")

_KEEP_CHARS = 1000  # each end of a text at level 2
_DEFAULTS = SamplingParams()


@dataclasses.dataclass
class RequestLog:
    enabled: bool = False
    level: int = 2
    format: str = "text"  # or "json"
    decode: Callable[[list[int]], str] = lambda ids: ""  # the prompt's text, from its token ids

    def configure(self, enabled: bool | None = None, level: int | None = None, format: str | None = None) -> None:
        """Change the settings given (None: keep); the caller has checked the values."""
        self.enabled = self.enabled if enabled is None else enabled
        self.level = self.level if level is None else level
        self.format = self.format if format is None else format
        logger.setLevel(logging.INFO)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = self.format != "json"  # text: the process's own line format
        if self.format == "json":
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)

    def received(self, state: ReqState, input_ids: list[int], params: SamplingParams) -> None:
        if not self.enabled:
            return
        state.log_end = True
        fields: dict[str, Any] = {"prompt_tokens": len(input_ids)}
        if self.level >= 1:  # a grammar (a tool call's is the server's own) cut as texts are
            fields["sampling_params"] = {k: self._cut(v) if isinstance(v, str) else v
                                         for k, v in changed_sampling_params(params).items()}
        if self.level >= 2:
            fields["prompt"] = self._cut(self.decode(input_ids))
        self._write("received", state.rid, fields)

    def ended(self, state: ReqState, how: str | None = None) -> None:
        """``state`` finished, failed or was aborted (``how`` says why, where the state does not)."""
        if not state.log_end:
            return
        state.log_end = False
        if how is not None:
            end: dict[str, Any] = {"ended": how}
        elif state.error is not None:
            end = {"error": state.error, "status": state.error_status}
        else:
            end = {"finish_reason": state.finished_reason}
        fields = {**end, "prompt_tokens": state.prompt_tokens, "cached_tokens": state.cached_tokens}
        # A request that does not stream gets its tokens at its end: ended before, they are unknown here.
        known = state.stream or state.finished_reason is not None
        if known:
            fields["completion_tokens"] = len(state.output_ids)
        if state.stream:
            first = state.first_token_at
            fields["first_token_s"] = None if first is None else round(first - state.created_at, 4)
        fields["total_s"] = round((state.finished_at or time.perf_counter()) - state.created_at, 4)
        if self.level >= 2 and known:
            fields["output"] = self._cut(state.text)
        self._write("ended", state.rid, fields)

    def _cut(self, text: str) -> str:
        if self.level >= 3 or len(text) <= 2 * _KEEP_CHARS + 40:
            return text
        return f"{text[:_KEEP_CHARS]}...({len(text):,} characters in all)...{text[-_KEEP_CHARS:]}"

    def _write(self, event: str, rid: str, fields: dict[str, Any]) -> None:
        if self.format == "json":
            logger.info("%s", json.dumps({"event": f"request.{event}", "rid": rid, **fields}, ensure_ascii=False))
        else:
            logger.info("request %s %s: %s", rid, event, ", ".join(f"{k}={v!r}" for k, v in fields.items()))


def changed_sampling_params(params: SamplingParams) -> dict[str, Any]:
    """The fields of ``params`` that differ from the defaults."""
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
            if f.name != "max_new_tokens_unset" and getattr(params, f.name) != getattr(_DEFAULTS, f.name)}
