"""Where the engine's time goes: forward steps by kind, with their tokens and seconds.

A prefill step computes prompt tokens (and, mixed in, one token of each running request); a
decode step computes one token of each running request. ``forward`` seconds are the worker's
(lowering, the model, sampling), ``scheduler`` seconds the rest of each step (choosing the
batch, stop checks, handing KV to the tree). ``/get_server_info`` and ``/metrics`` show the
totals, so a benchmark can tell whether a workload waits on prefill or on decode.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class StepStats:
    prefill_steps: int = 0
    prefill_tokens: int = 0  # prompt tokens computed in prefill steps (not the mixed-in decodes)
    prefill_mixed_decodes: int = 0  # running requests' tokens computed inside prefill steps
    prefill_seconds: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0  # one per running request per decode step
    decode_seconds: float = 0.0
    scheduler_seconds: float = 0.0  # step time outside the forward

    def record(self, is_decode: bool, num_tokens: int, num_mixed_decodes: int, forward_s: float, step_s: float) -> None:
        """One step of ``num_tokens`` tokens (of which ``num_mixed_decodes`` were running
        requests' in a prefill step) whose forward took ``forward_s`` of ``step_s``."""
        if is_decode:
            self.decode_steps += 1
            self.decode_tokens += num_tokens
            self.decode_seconds += forward_s
        else:
            self.prefill_steps += 1
            self.prefill_tokens += num_tokens - num_mixed_decodes
            self.prefill_mixed_decodes += num_mixed_decodes
            self.prefill_seconds += forward_s
        self.scheduler_seconds += max(0.0, step_s - forward_s)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)
