"""One way in: what a caller sends (token ids per prompt, sampling parameters, options)
becomes checked ``GenerateRequest``s, the same for ``Engine.generate``, the native
``/generate`` and the OpenAI routes. Each edge only turns its own body into token ids
(tokenizing text or applying the chat template) and maps ``InvalidField`` to its way of
saying no: a ``ValueError`` offline, a 400 naming the field over HTTP.

Checks: every prompt has tokens, all inside the vocabulary; the sampling parameters parse
and their token ids exist; a regex / json_schema / ebnf constraint parses; the logprob options fit the vocabulary; prompt plus
``max_new_tokens`` fit the KV pool and the context (with ``auto_truncate``, SGLang's
``--allow-auto-truncate``, or where the request left ``max_new_tokens`` out, only the
prompt must fit the context: ``max_new_tokens`` is cut to the room left, as SGLang does). ``n`` expands
into that many requests, prompt-major.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.constrained.spec import check_constraint
from runtime.request_options import RequestOptions
from runtime.sampling.params import InvalidField, SamplingParams, check_logprob_options


@dataclass(frozen=True)
class RequestLimits:
    vocab_size: int
    max_context_len: int
    max_total_tokens: int  # the KV pool
    auto_truncate: bool = False  # generation may stop at the context instead of a 400
    max_logprobs: int = 20  # top logprobs per token (--max-logprobs; -1: the vocabulary)

    @property
    def max_top_logprobs(self) -> int:
        return self.vocab_size if self.max_logprobs == -1 else min(self.max_logprobs, self.vocab_size)

    @property
    def max_sequence_len(self) -> int:
        """The most tokens one request can hold, prompt and answer together: the context
        length, or the KV pool where that is smaller."""
        return min(self.max_context_len, self.max_total_tokens)


class PartOfPrompt(list[int]):
    """The token ids of only a part of a prompt's text, its first (or last) ``chars``
    characters: the server tokenizes no more of a text too long for the context whatever its
    tokens, so the whole text's count is not known, and errors must not state it as known."""

    def __init__(self, ids: list[int], chars: int, end: bool) -> None:
        super().__init__(ids)
        self.chars, self.end = chars, end

    def described(self) -> str:
        """What the count is of: words for an error message."""
        return f"{len(self):,} tokens in its {'last' if self.end else 'first'} {self.chars:,} characters alone"


@dataclass
class GenerateRequest:
    """One request as it enters, checked; ``n`` already expanded."""

    input_ids: list[int]
    params: SamplingParams
    options: RequestOptions


def parse_sampling_params(spec: Any, num_prompts: int,
                          on_unknown: Callable[[str], None] | None = None) -> list[SamplingParams]:
    """One ``SamplingParams`` per prompt from a dict (shared), a list of dicts (one each) or
    None (defaults); names no sampling parameter has go to ``on_unknown`` (see
    ``SamplingParams.from_dict``)."""
    if isinstance(spec, list):
        if len(spec) != num_prompts:
            raise InvalidField("sampling_params", f"got {len(spec)} sampling_params for {num_prompts} prompts")
        if not all(isinstance(p, dict) for p in spec):
            raise InvalidField("sampling_params", "sampling_params must be a dict or a list of dicts")
        return [SamplingParams.from_dict(p, on_unknown) for p in spec]
    if spec is not None and not isinstance(spec, dict):
        raise InvalidField("sampling_params", "sampling_params must be a dict or a list of dicts")
    return [SamplingParams.from_dict(spec, on_unknown)] * num_prompts


def one_per_prompt(value: Any, name: str, num_prompts: int) -> list[Any]:
    """A value given once for every prompt, or as a list of one per prompt (SGLang's
    ``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``), as one per prompt."""
    if not isinstance(value, list):
        return [value] * num_prompts
    if len(value) != num_prompts:
        raise InvalidField(name, f"got {len(value)} values of {name} for {num_prompts} prompts")
    return value


def build_requests(prompts: list[list[int]], params: list[SamplingParams],
                   options: RequestOptions | list[RequestOptions], limits: RequestLimits, *,
                   prompt_field: str) -> list[GenerateRequest]:
    """Checked requests for ``prompts`` (``params[i]`` and, given a list, ``options[i]`` for
    prompt ``i``); raises ``InvalidField`` for the first problem, before anything is
    queued. ``prompt_field`` names the prompt in errors (``prompt``, ``text``, ``input_ids``...)."""
    per_prompt = options if isinstance(options, list) else [options] * len(prompts)
    requests = []
    for ids, p, opts in zip(prompts, params, per_prompt, strict=True):
        if not isinstance(opts.return_logprob, bool):
            raise InvalidField("return_logprob", f"return_logprob must be True or False, got {opts.return_logprob!r}")
        check_logprob_options(opts.logprob_start_len, opts.top_logprobs_num, limits.max_top_logprobs,
                              limits.max_logprobs != -1)
        check_prompt(ids, limits, prompt_field)
        if opts.return_logprob and opts.logprob_start_len > len(ids):  # the length itself: none of the prompt's
            raise InvalidField("logprob_start_len", f"logprob_start_len ({opts.logprob_start_len}) must be at most "
                               f"the prompt's length ({len(ids)} tokens), or -1 for output tokens only")
        p.check_vocab(limits.vocab_size)
        check_constraint(p)
        room = limits.max_sequence_len - len(ids)
        if 0 < room < p.max_new_tokens and (limits.auto_truncate or p.max_new_tokens_unset):
            p = dataclasses.replace(p, max_new_tokens=room)  # it runs to the context (or the pool), no further
        check_lengths(len(ids), p.max_new_tokens, limits, prompt_field,
                      ids.described() if isinstance(ids, PartOfPrompt) else None)
        requests += [GenerateRequest(ids, _nth_sample(p, k), opts) for k in range(p.n)]
    return requests


def score_each_prompt_once(requests: list[GenerateRequest], *, each_own: bool = False,
                           ) -> tuple[list[GenerateRequest], list[int]]:
    """The ``n`` samples of a prompt that ask for its logprobs (``logprob_start_len`` inside
    it) all report the same ones: only the first computes them, the others ask for none
    (and reuse its cached prompt); n 8 of an 8k-token prompt computed them 8 times. Returns
    the requests so changed and, for each, the index of the request whose prompt logprobs
    it reports. ``each_own``: nothing changes, each sample reports its own: a stream (its
    samples report as they come), or samples with ids of the client's, which it may abort
    one at a time (the others would have lost the first's logprobs)."""
    if each_own:
        return requests, list(range(len(requests)))
    out: list[GenerateRequest] = []
    source: list[int] = []
    for k, r in enumerate(requests):
        prev = requests[k - 1] if k else None
        opts = r.options
        if (prev is not None and prev.input_ids is r.input_ids and prev.options == opts  # a sample of the same prompt
                and opts.return_logprob and 0 <= opts.logprob_start_len < len(r.input_ids)):
            source.append(source[-1])
            out.append(dataclasses.replace(r, options=dataclasses.replace(opts, logprob_start_len=-1)))
        else:
            source.append(k)
            out.append(r)
    return out, source


def _nth_sample(params: SamplingParams, k: int) -> SamplingParams:
    """The ``k``-th of ``n`` samples: with a seed, its own seed derived from it (as vLLM
    does), so ``n`` seeded samples differ and the same request gives the same ``n`` again."""
    if k == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + k) % 2**64)


def check_prompt(ids: list[int], limits: RequestLimits, field: str) -> None:
    if not ids:
        raise InvalidField(field, "the prompt is empty: at least one token is needed")
    check_token_ids(ids, limits.vocab_size, field)


def check_token_ids(ids: list[int], vocab_size: int, field: str) -> None:
    if any(t < 0 or t >= vocab_size for t in ids):
        raise InvalidField(field, f"{field}: token ids must be in [0, {vocab_size}) (the vocabulary)")


def check_lengths(prompt_len: int, max_new: int, limits: RequestLimits, prompt_field: str = "prompt",
                  partial: str | None = None) -> None:
    """Refuse a prompt that fills the context, and prompt + max_new beyond the context (as
    OpenAI, vLLM and SGLang do) unless ``limits.auto_truncate``, or beyond the KV pool.
    ``partial``: the count is of a part of the prompt only (``PartOfPrompt.described``)."""
    ctx, pool = limits.max_context_len, limits.max_total_tokens
    has = f"has {prompt_len}" if partial is None else f"is longer than that ({partial})"
    if prompt_len >= ctx:
        raise InvalidField(prompt_field, f"This model's maximum context length is {ctx} tokens, and the prompt alone "
                                         f"{has}: it must leave room for at least one generated token.")
    if prompt_len >= pool:
        raise InvalidField(prompt_field, f"The KV cache holds {pool} tokens, and the prompt alone {has}: it "
                                         "must leave room for at least one generated token.")
    if not limits.auto_truncate and prompt_len + max_new > ctx:
        raise InvalidField(
            "max_new_tokens",
            f"This model's maximum context length is {ctx} tokens. However, you requested "
            f"{prompt_len + max_new} tokens ({prompt_len} in the prompt, {max_new} for the completion).",
        )
    if prompt_len + max_new > pool:
        raise InvalidField(
            "max_new_tokens",
            f"The request needs {prompt_len + max_new} tokens ({prompt_len} in the prompt, {max_new} "
            f"for the completion) but the KV cache holds {pool}.",
        )
