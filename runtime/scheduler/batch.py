"""A step as the scheduler decides it (``ScheduledBatch``: which requests, how many tokens
each, which KV slots), and its lowering to the executor's data (``lower`` ->
``runtime/executor/model_input.py``), where the per-request decisions are made: which
tokens a request may not draw yet, and which prompt tokens' logprobs it reports."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radix_cache import ReqToTokenTable
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
    # The last this many requests of an extend batch are running requests decoding (mixed
    # into a prefill step, or every request of a step that checks drafts).
    num_mixed_decodes: int = 0
    # Per request: guessed tokens it checks after its last token (speculative decoding); it
    # then samples greedily at each of its last 1 + draft_lens[i] positions. Empty: none.
    draft_lens: list[int] | None = None

    @property
    def decodes_only(self) -> bool:
        """Every request of the step is a running request decoding (with or without drafts)."""
        return self.is_decode or self.num_mixed_decodes == len(self.reqs)

    def draft_len(self, i: int) -> int:
        return self.draft_lens[i] if self.draft_lens else 0

    def append_decodes(self, decodes: ScheduledBatch) -> None:
        """Mix a decode batch into this extend batch: each running request's next token as
        a one-token extend at the end, so the step decodes them too."""
        self.reqs += decodes.reqs
        self.input_ids = torch.cat([self.input_ids, decodes.input_ids])
        self.positions = torch.cat([self.positions, decodes.positions])
        self.prefix_lens += decodes.prefix_lens
        self.extend_lens += decodes.extend_lens
        self.out_cache_loc = torch.cat([self.out_cache_loc, decodes.out_cache_loc])
        self.logit_starts += decodes.logit_starts
        self.samples += decodes.samples
        self.num_mixed_decodes = len(decodes.reqs)
        if decodes.draft_lens:
            self.draft_lens = [0] * (len(self.reqs) - len(decodes.reqs)) + decodes.draft_lens


def extend_batch(picked: list[tuple[Req, int]], table: ReqToTokenTable) -> ScheduledBatch:
    """A prefill (extend) step: request ``req`` computes its next ``n`` prompt (or forced)
    tokens, into the slots ``table`` already holds for them; it samples after its last chunk."""
    reqs, ids, positions, prefix_lens, extend_lens, locs, logit_starts, samples = [], [], [], [], [], [], [], []
    for req, n in picked:
        start, end = req.kv_len, req.kv_len + n
        is_last_chunk = end == len(req.fill_ids)
        wants_sample = is_last_chunk and req.params.max_new_tokens > 0
        if req.wants_input_logprobs:  # logits at p give the logprob of prompt token p + 1
            logit_start = min(max(start, req.options.logprob_start_len), end)
        else:
            logit_start = end - 1 if wants_sample else end
        reqs.append(req)
        ids.extend(req.fill_ids[start:end])
        positions.append(torch.arange(start, end))
        prefix_lens.append(start)
        extend_lens.append(n)
        locs.append(table.read(req.row, end, start))  # type: ignore[arg-type]
        logit_starts.append(logit_start)
        samples.append(wants_sample)
    return ScheduledBatch(False, reqs, torch.tensor(ids, dtype=torch.int64), torch.cat(positions), prefix_lens,
                          extend_lens, torch.cat(locs), logit_starts, samples)


def decode_batch(reqs: list[Req], out_cache_loc: torch.Tensor) -> ScheduledBatch:
    """A decode step: each request's last token at its last position, written to its new slot.
    Where requests carry drafts (``req.draft``, slots granted for them too), an extend of the
    last token and the draft, with logits at each of those positions."""
    if any(r.draft for r in reqs):
        return _draft_check_batch(reqs, out_cache_loc)
    last = [r.alloc_len - 1 for r in reqs]
    return ScheduledBatch(True, reqs, torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64),
                          torch.tensor(last, dtype=torch.int64), last, [1] * len(reqs), out_cache_loc, list(last),
                          [True] * len(reqs))


def _draft_check_batch(reqs: list[Req], out_cache_loc: torch.Tensor) -> ScheduledBatch:
    ids: list[int] = []
    starts, lens = [], []
    for r in reqs:
        n = 1 + len(r.draft)
        ids += [r.output_ids[-1], *r.draft]
        starts.append(r.alloc_len - n)
        lens.append(n)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
    return ScheduledBatch(False, reqs, torch.tensor(ids, dtype=torch.int64), positions, starts, lens, out_cache_loc,
                          list(starts), [True] * len(reqs), num_mixed_decodes=len(reqs),
                          draft_lens=[len(r.draft) for r in reqs])


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
        num_prompt = batch.prefix_lens[i] + batch.extend_lens[i] - start - (1 if samples else 0) - batch.draft_len(i)
        # logits at position p give the logprob of prompt token p + 1; the prompt's last
        # position has none after it
        targets = req.input_ids[start + 1 : start + 1 + num_prompt] if num_prompt > 0 else []
        first = req.options.logprob_start_len  # reported first, with no logprob, by the step computing it
        computes_first = req.wants_input_logprobs and batch.prefix_lens[i] <= first < batch.prefix_lens[i] + batch.extend_lens[i]
        unscored = req.input_ids[first] if computes_first else None
        opts = req.options
        top_k = opts.top_logprobs_num if opts.prompt_top_logprobs_num is None else opts.prompt_top_logprobs_num
        prompt.append(PromptLogprobs(targets, top_k, unscored)
                      if targets or unscored is not None else None)
    return ModelInput(forward, list(batch.logit_starts), sampling, prompt,
                      [batch.draft_len(i) for i in range(len(batch.reqs))])


def banned_ids(req: Req, eos_token_ids: tuple[int, ...]) -> list[int]:
    """Tokens that would end the request before ``min_new_tokens``."""
    if len(req.output_ids) >= req.params.min_new_tokens:
        return []
    stops = list(req.params.stop_token_ids)
    if not req.params.ignore_eos:
        stops += list(eos_token_ids)
    return stops
