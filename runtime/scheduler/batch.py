"""A step as the scheduler decides it (``ScheduledBatch``: which requests, how many tokens
each, which KV slots), and its lowering to the executor's data (``lower`` ->
``runtime/executor/model_input.py``), where the per-request decisions are made: which
tokens a request may not draw yet, and which prompt tokens' logprobs it reports."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.constrained.bitmask import allocate_bitmask, clear_bits
from runtime.executor.model_input import ForwardInput, ModelInput, PromptLogprobs, SamplingRow
from runtime.scheduler.req import Req


@dataclass
class ScheduledBatch:
    """One step's work. Request ``i`` computes positions ``[prefix_lens[i], prefix_lens[i] +
    extend_lens[i])`` and needs logits at positions ``[logit_starts[i], that end)``, an empty
    range when it neither samples nor reports prompt logprobs in this chunk."""

    is_decode: bool
    reqs: list[Req]
    input_ids: torch.Tensor
    positions: torch.Tensor
    prefix_lens: list[int]
    extend_lens: list[int]
    out_cache_loc: torch.Tensor
    logit_starts: list[int]
    samples: list[bool]  # whether request i samples a next token at its last position
    # The last this many requests of an extend batch are running requests decoding one token
    # each (mixed into a prefill step).
    num_mixed_decodes: int = 0


def lower(batch: ScheduledBatch, eos_token_ids: tuple[int, ...], vocab_size: int) -> ModelInput:
    """The executor's input for ``batch``: tensors and per-request data, no ``Req``."""
    forward = ForwardInput(
        batch.is_decode, torch.tensor([r.row for r in batch.reqs], dtype=torch.int64), batch.input_ids,
        batch.positions, batch.prefix_lens, batch.extend_lens, batch.out_cache_loc,
    )
    sampling: list[SamplingRow | None] = []
    prompt: list[PromptLogprobs | None] = []
    constrained = [i for i, req in enumerate(batch.reqs) if req.grammar is not None and batch.samples[i]]
    masks = allocate_bitmask(len(constrained), vocab_size) if constrained else None
    for i, req in enumerate(batch.reqs):
        samples = batch.samples[i]
        row = None
        if samples:
            banned = banned_ids(req, eos_token_ids)
            allowed = None
            if req.grammar is not None:
                allowed = masks[constrained.index(i)]  # type: ignore[index]
                req.grammar.fill_bitmask(masks, constrained.index(i))  # type: ignore[arg-type]
                # min_new_tokens' bans go into the mask, unless the grammar allows nothing else
                clear_bits(allowed, banned, vocab_size)
                banned = []
            row = SamplingRow(req.params, req.input_ids, req.output_ids, req.generator, req.options, banned, allowed)
        sampling.append(row)
        start = batch.logit_starts[i]
        num_prompt = batch.prefix_lens[i] + batch.extend_lens[i] - start - (1 if samples else 0)
        # logits at position p give the logprob of prompt token p + 1; the prompt's last
        # position has none after it
        targets = req.input_ids[start + 1 : start + 1 + num_prompt] if num_prompt > 0 else []
        prompt.append(PromptLogprobs(targets, req.options.top_logprobs_num) if targets else None)
    return ModelInput(forward, list(batch.logit_starts), sampling, prompt)


def banned_ids(req: Req, eos_token_ids: tuple[int, ...]) -> list[int]:
    """Tokens that would end the request before ``min_new_tokens``."""
    if len(req.output_ids) >= req.params.min_new_tokens:
        return []
    stops = list(req.params.stop_token_ids)
    if not req.params.ignore_eos:
        stops += list(eos_token_ids)
    return stops
