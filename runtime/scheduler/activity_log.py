"""What the scheduler process logs about its work (vLLM's periodic line, SGLang's per-batch
lines): at info, every ``interval_s`` seconds that saw work, prompt and generation throughput,
the cache hit rate of the requests that finished, queues and the KV pool; at debug, a line for
each step. Read from the core's own counters, so it costs nothing when nothing is logged."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.scheduler.core import EngineCore, RequestOutput

logger = logging.getLogger("forkserve")

MAX_IDLE_WAIT_MS = 3_600_000


class ActivityLog:
    def __init__(self, core: EngineCore, interval_s: float = 10.0) -> None:
        self.core, self.interval_s = core, interval_s
        self.steps = core.scheduler.steps  # the step counters (StepStats) it reads
        self._since = time.monotonic()
        self._last = self._step_counts()
        self._window_prefill = self.steps.prefill_tokens
        self._generated = self._finished = self._prompt = self._cached = 0

    def step_starting(self) -> None:
        """A step is about to run: after an idle time with nothing to report, a new window
        opens now (the idle time does not dilute its rates)."""
        if not self.pending:
            self._since = time.monotonic()

    def record(self, outputs: list[RequestOutput]) -> None:
        """One step's outputs."""
        for out in outputs:
            self._generated += out.num_new
            if out.finished:
                self._finished += 1
                self._prompt += len(out.req.input_ids)
                self._cached += out.req.cached_tokens
        counts = self._step_counts()
        prefill, mixed, decode = (now - before for now, before in zip(counts, self._last, strict=True))
        self._last = counts
        if logger.isEnabledFor(logging.DEBUG):
            stats = self.core.stats()
            kind = f"prefill {prefill} prompt tokens" + (f" + {mixed} running" if mixed else "") if prefill \
                else f"decode {decode} request" + "s" * (decode != 1)
            logger.debug("step: %s; %d running, %d waiting", kind, stats["num_running_reqs"], stats["num_waiting_reqs"])

    @property
    def pending(self) -> bool:
        """Whether work since the last line waits to be reported."""
        return self._generated > 0 or self._finished > 0 or self.steps.prefill_tokens > self._window_prefill

    def seconds_to_next(self) -> float:
        return max(0.0, self._since + self.interval_s - time.monotonic())

    def idle_wait_ms(self) -> int | None:
        """How long the idle loop may wait for a message: until a pending line is due, at
        most an hour (a ZMQ poll takes at most 2**31 - 1 ms, and the interval may be any
        length), or for ever (None) with nothing pending."""
        return min(int(1000 * self.seconds_to_next()) + 1, MAX_IDLE_WAIT_MS) if self.pending else None

    def maybe_log(self) -> None:
        """The info line, if ``interval_s`` has passed since the last one and there was work."""
        if self.seconds_to_next() > 0 or not self.pending:
            return
        now, stats = time.monotonic(), self.core.stats()
        elapsed = now - self._since
        computed = self.steps.prefill_tokens - self._window_prefill
        hit = f", {self._cached / self._prompt:.0%} of the prompt tokens of {self._finished} finished requests cached" \
            if self._prompt else ""
        cap = stats["kv_capacity"] or 1
        logger.info("last %.0f s: %d prompt tokens computed (%.1f/s)%s; %d tokens generated (%.1f/s); %d running, "
                    "%d waiting; KV pool %.0f%% held by requests, %.0f%% cached", elapsed, computed, computed / elapsed,
                    hit, self._generated, self._generated / elapsed, stats["num_running_reqs"], stats["num_waiting_reqs"],
                    100 * (stats["kv_held_by_requests"] + stats["kv_protected"]) / cap,
                    100 * stats["kv_evictable"] / cap)
        self._since, self._window_prefill = now, self.steps.prefill_tokens
        self._generated = self._finished = self._prompt = self._cached = 0

    def _step_counts(self) -> tuple[int, int, int]:
        return self.steps.prefill_tokens, self.steps.prefill_mixed_decodes, self.steps.decode_tokens
