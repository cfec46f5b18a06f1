"""What the executor gets for one step: data, not the scheduler's requests.

The scheduler decides which requests run and how many tokens each computes (its
``ScheduledBatch``, ``runtime/scheduler/batch.py``) and lowers that to a ``ModelInput``:
  - ``ForwardInput``: what every tensor-parallel rank runs (token ids, positions, KV slots,
    which table rows the attention reads), picklable, sent as is to ranks 1..N-1;
  - per request, where its logits are needed, whether and how it samples (``SamplingRow``,
    with the token ids it may not draw yet) and which prompt tokens' logprobs it reports
    (``PromptLogprobs``). These per-request decisions are the scheduler's.
The worker (``worker.py``) runs the forward, samples and returns a ``BatchResult``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.request_options import RequestOptions
from runtime.sampling.params import SamplingParams
from runtime.sampling.seed_stream import SeedStream


@dataclass
class ForwardInput:
    """Request ``i`` computes positions ``[prefix_lens[i], prefix_lens[i] + extend_lens[i])``
    and attends through row ``rows[i]`` of the request-to-token table."""

    is_decode: bool
    rows: torch.Tensor  # [bs] int64
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    prefix_lens: list[int]
    extend_lens: list[int]
    out_cache_loc: torch.Tensor  # [num_tokens] int64: the KV slot each token writes


@dataclass
class SamplingRow:
    """What the sampler reads of one request that samples this step (``SamplingRequest``).
    The token lists are the request's own (for penalties), not copies."""

    params: SamplingParams
    input_ids: list[int]
    output_ids: list[int]
    generator: SeedStream | None
    options: RequestOptions
    banned_ids: list[int]  # may not be drawn yet (stop tokens before min_new_tokens)
    # constrained decoding: the tokens the grammar allows next, as one bitmask row (int32,
    # bit t % 32 of word t // 32); None: unconstrained
    allowed: torch.Tensor | None = None


@dataclass
class PromptLogprobs:
    """Report the logprobs of ``targets`` (the prompt tokens after the logits' positions),
    with the ``top_k`` most likely tokens at each when above 0; first ``unscored``, where
    this step starts the request's report: the token at its ``logprob_start_len``, which
    gets no logprob (the logits before it are not computed; SGLang reports it so too)."""

    targets: list[int]
    top_k: int
    unscored: int | None = None


@dataclass
class ModelInput:
    forward: ForwardInput
    # Request i needs logits at positions [logit_starts[i], its end): the prompt positions
    # whose logprobs it reports, then its last position if it samples.
    logit_starts: list[int]
    sampling: list[SamplingRow | None]  # per request; None: it does not sample this step
    prompt_logprobs: list[PromptLogprobs | None]  # per request
    # per request: guessed tokens after its last token that it checks (speculative decoding):
    # it picks greedily at each of its last 1 + draft_lens[i] positions; empty: none anywhere
    draft_lens: list[int] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return len(self.logit_starts)
