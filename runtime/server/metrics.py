"""Prometheus metrics, written in the text exposition format (no client library needed).

Token counts and latencies are observed in the HTTP process as results arrive; queue and
KV figures come from the scheduler's ``stats`` call when ``/metrics`` is scraped.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = _LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(_LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.total += value * times
        self.n += times

    def lines(self, name: str) -> list[str]:
        out, cum = [], 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            cum += count
            out.append(f'{name}_bucket{{le="{bound}"}} {cum}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        out.append(f"{name}_sum {self.total}")
        out.append(f"{name}_count {self.n}")
        return out


@dataclass
class ServerMetrics:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    requests_total: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    inter_token: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)

    def on_submit(self, prompt_len: int) -> None:
        self.requests_total += 1
        self.prompt_tokens += prompt_len

    def on_abort(self) -> None:
        self.requests_aborted += 1

    def on_tokens(self, state: Any, num_new: int, is_first: bool, last_at: float | None) -> None:
        if not num_new:
            return
        self.generation_tokens += num_new
        if is_first:
            self.ttft.observe(state.first_token_at - state.created_at)
            num_new -= 1
        if num_new and last_at is not None:
            self.inter_token.observe((state.last_token_at - last_at) / num_new, num_new)

    def on_finish(self, state: Any) -> None:
        """A request's last output: one ended by an abort finish (``/abort_request``, or a
        request the scheduler failed: its grammar, a stop regex past its time) counts as
        aborted, not finished, and its shortened latency stays out of the histogram."""
        self.cached_tokens += state.cached_tokens
        if (state.finished_reason or {}).get("type") == "abort":
            self.requests_aborted += 1
            return
        self.requests_finished += 1
        self.e2e.observe(state.finished_at - state.created_at)

    def render(self, stats: dict[str, int | float], model_name: str) -> str:
        label = f'{{model_name="{model_name}"}}'
        hit_rate = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        used = stats["kv_capacity"] - stats["kv_free"] - stats["kv_evictable"]
        rows: list[tuple[str, str, str, float]] = [
            ("counter", "prompt_tokens_total", "Prompt tokens received.", self.prompt_tokens),
            ("counter", "cached_tokens_total", "Prompt tokens served from the prefix cache (finished requests).", self.cached_tokens),
            ("counter", "generation_tokens_total", "Tokens generated.", self.generation_tokens),
            ("counter", "requests_total", "Requests received.", self.requests_total),
            ("counter", "requests_finished_total", "Requests finished.", self.requests_finished),
            ("counter", "requests_aborted_total", "Requests that ended unfinished: their client went away, /abort_request ended them, or they failed.", self.requests_aborted),
            ("gauge", "cache_hit_rate", "cached_tokens_total / prompt_tokens_total.", hit_rate),
            ("gauge", "num_running_reqs", "Requests admitted to the batch.", stats["num_running_reqs"]),
            ("gauge", "num_waiting_reqs", "Requests waiting to be scheduled.", stats["num_waiting_reqs"]),
            ("gauge", "kv_usage", "Fraction of KV slots in use by requests (not counting evictable cache).", used / stats["kv_capacity"]),
            ("gauge", "kv_cached_tokens", "Tokens held in the radix cache.", stats["kv_evictable"] + stats["kv_protected"]),
            ("counter", "prefill_steps_total", "Forward steps that computed prompt tokens.", stats["step_prefill_steps"]),
            ("counter", "prefill_computed_tokens_total", "Prompt tokens computed (not served from the cache).", stats["step_prefill_tokens"]),
            ("counter", "prefill_seconds_total", "Seconds in prefill steps' forward and sampling.", stats["step_prefill_seconds"]),
            ("counter", "decode_steps_total", "Forward steps that only decoded.", stats["step_decode_steps"]),
            ("counter", "decode_seconds_total", "Seconds in decode steps' forward and sampling.", stats["step_decode_seconds"]),
            ("counter", "scheduler_seconds_total", "Seconds of steps outside the forward (batching, stop checks, cache).", stats["step_scheduler_seconds"]),
        ]
        out: list[str] = []
        for kind, name, help_text, value in rows:
            out += [f"# HELP forkserve:{name} {help_text}", f"# TYPE forkserve:{name} {kind}", f"forkserve:{name}{label} {value}"]
        for name, hist, help_text in (
            ("time_to_first_token_seconds", self.ttft, "Time to first token."),
            ("inter_token_latency_seconds", self.inter_token, "Time between output tokens."),
            ("e2e_request_latency_seconds", self.e2e, "Request latency, submit to finish."),
        ):
            out += [f"# HELP forkserve:{name} {help_text}", f"# TYPE forkserve:{name} histogram"]
            out += [
                line.replace("{", "{" + f'model_name="{model_name}",', 1) if "{" in line else line.replace(" ", label + " ", 1)
                for line in hist.lines(f"forkserve:{name}")
            ]
        return "\n".join(out) + "\n"
