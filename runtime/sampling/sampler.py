"""Turn a step's logits into next tokens: penalties, then greedy or temperature/top-k/top-p/min-p.

Logprobs reported to users are those of the model's raw distribution (``log_softmax`` of
the logits before penalties and temperature), which is what a client comparing against
the model itself expects; for a constrained request, of that distribution restricted to
what its grammar allows (the mask comes first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from runtime.constrained.bitmask import apply_bitmask
from runtime.request_options import RequestOptions
from runtime.sampling.params import SamplingParams


class SamplingRequest(Protocol):
    params: SamplingParams
    input_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None
    options: RequestOptions  # return_logprob and top_logprobs_num are read
    allowed: torch.Tensor | None  # a grammar's allowed-token bitmask row, or None


@dataclass
class SampleOutput:
    next_ids: list[int]
    logprobs: list[float | None]  # per request; None where not asked for
    top_logprobs: list[list[tuple[float, int]] | None]


def apply_penalties(logits: torch.Tensor, reqs: list[SamplingRequest], banned: list[list[int]]) -> None:
    """In place: frequency/presence penalties on output tokens (OpenAI's rule), repetition
    penalty on prompt and output tokens (the CTRL/HF rule), and ``banned`` ids set to -inf."""
    for i, req in enumerate(reqs):
        p = req.params
        if p.has_penalties:
            row = logits[i]
            if req.output_ids and (p.frequency_penalty or p.presence_penalty):
                counts = torch.bincount(torch.tensor(req.output_ids), minlength=row.numel()).to(row.dtype)
                row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
            if p.repetition_penalty != 1.0:
                seen = torch.tensor(sorted(set(req.input_ids) | set(req.output_ids)))
                vals = row[seen]
                row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if banned[i]:
            logits[i, banned[i]] = float("-inf")


def filter_probs(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Zero the tokens outside each row's top-k, top-p nucleus and min-p floor; renormalise.

    ``top_k`` <= 0 means no limit. The most likely token always survives.
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device).unsqueeze(0)
    k = torch.where(top_k > 0, top_k, probs.shape[-1]).unsqueeze(1)
    drop = ranks >= k
    # keep a token if the mass strictly before it is below top_p; top_p >= 1 is off (in
    # float32 the cumulative sum reaches 1.0 before a peaked distribution's tail)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    drop |= (mass_before >= top_p.unsqueeze(1)) & (top_p.unsqueeze(1) < 1)
    drop |= sorted_probs < (min_p.unsqueeze(1) * sorted_probs[:, :1])
    drop[:, 0] = False
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return out / out.sum(-1, keepdim=True)


def torch_argmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


def sample(
    logits: torch.Tensor,
    reqs: list[SamplingRequest],
    banned: list[list[int]],
    default_gen: torch.Generator,
    argmax: Callable[[torch.Tensor], torch.Tensor] = torch_argmax,
) -> SampleOutput:
    """``logits``: float32 ``[len(reqs), vocab]`` (modified in place). ``argmax`` picks each
    row's first largest logit (the worker passes the compiled one on the cpu backend)."""
    constrained = [i for i, r in enumerate(reqs) if r.allowed is not None]
    if constrained:  # before everything else: penalties, temperature and logprobs see the mask
        rows = torch.tensor(constrained)
        masked = logits[rows]
        apply_bitmask(masked, torch.stack([reqs[i].allowed for i in constrained]))  # type: ignore[misc]
        logits[rows] = masked
    want_logprobs = [r.options.return_logprob for r in reqs]
    raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
    apply_penalties(logits, reqs, banned)

    next_ids = argmax(logits)
    random_rows = [i for i, r in enumerate(reqs) if not r.params.is_greedy]
    if random_rows:
        rows = torch.tensor(random_rows)
        temps = torch.tensor([reqs[i].params.temperature for i in random_rows], dtype=logits.dtype)
        probs = torch.softmax(logits[rows] / temps.unsqueeze(1), dim=-1)
        probs = filter_probs(
            probs,
            torch.tensor([reqs[i].params.top_k for i in random_rows]),
            torch.tensor([reqs[i].params.top_p for i in random_rows], dtype=probs.dtype),
            torch.tensor([reqs[i].params.min_p for i in random_rows], dtype=probs.dtype),
        )
        for j, i in enumerate(random_rows):
            gen = reqs[i].generator or default_gen
            next_ids[i] = torch.multinomial(probs[j], 1, generator=gen)[0]

    ids = next_ids.tolist()
    logprobs: list[float | None] = [None] * len(reqs)
    tops: list[list[tuple[float, int]] | None] = [None] * len(reqs)
    if raw_logprobs is not None:
        for i, r in enumerate(reqs):
            if not r.options.return_logprob:
                continue
            logprobs[i] = float(raw_logprobs[i, ids[i]])
            if r.options.top_logprobs_num > 0:
                vals, idx = raw_logprobs[i].topk(r.options.top_logprobs_num)
                tops[i] = list(zip(vals.tolist(), idx.tolist(), strict=True))
    return SampleOutput(ids, logprobs, tops)
