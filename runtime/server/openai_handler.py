"""What the OpenAI routes share: a handler's sampling parameters (with the request's output
constraint), its checks, the submission of ``n`` requests per prompt, usage, and the answer,
whole or streamed. ``Completion`` and ``ChatCompletion`` fill in their own choices."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from runtime.request_builder import build_requests, score_each_prompt_once
from runtime.request_options import RequestOptions, cache_namespace
from runtime.sampling.params import MAX_N, SamplingParams
from runtime.server.context import ServerContext, bad_input_as_400, sampling_params
from runtime.server.openai_constraint import OutputConstraint
from runtime.server.prompt_logprobs import render
from runtime.server.protocol import ApiError, reject_unsupported
from runtime.server.protocol_openai import OpenAISampling
from runtime.server.request_ids import request_ids
from runtime.server.responses import SSE_DONE, JsonResponse, error_of, merged_updates, sse, wait_all
from runtime.server.scheduler_client import ReqState


def usage_body(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """OpenAI's ``usage`` object."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def finish_reason_of(state: ReqState) -> str | None:
    reason = state.finished_reason
    if reason is None:
        return None
    return {"stop": "stop", "length": "length"}.get(reason["type"], reason["type"])


class OpenAIHandler(OutputConstraint):
    """The parts completions and chat share: sampling params, submission, usage, streaming."""

    object_name = ""
    id_prefix = ""

    def __init__(self, ctx: ServerContext, req: OpenAISampling, request: Request) -> None:
        self.ctx, self.req, self.request = ctx, req, request
        # vLLM's X-Request-Id header names the request where the body does not (rid, request_id)
        self.header_id = request.headers.get("x-request-id") or None
        self.id = f"{self.id_prefix}-{req.request_id or self.header_id or uuid.uuid4().hex}"
        self.created = int(time.time())
        self.prompts: list[list[int]] = []  # the submitted prompts' token ids
        self.rendered_prompt_logprobs: dict[int, list[dict[str, Any] | None]] = {}  # by prompt (vLLM's field)

    def params(self, max_new_tokens: int) -> SamplingParams:
        r = self.req
        d = {
            "max_new_tokens": max_new_tokens,
            "min_new_tokens": r.min_tokens,
            "temperature": r.temperature,
            "top_p": r.top_p,
            "top_k": r.top_k,
            "min_p": r.min_p,
            "stop": r.stop,
            "stop_token_ids": r.stop_token_ids,
            "stop_regex": r.stop_regex,
            "frequency_penalty": r.frequency_penalty,
            "presence_penalty": r.presence_penalty,
            "repetition_penalty": r.repetition_penalty,
            "logit_bias": r.logit_bias,
            "ignore_eos": r.ignore_eos,
            "skip_special_tokens": r.skip_special_tokens,
            "no_stop_trim": r.no_stop_trim,
            "include_stop_str_in_output": r.include_stop_str_in_output,
            "spaces_between_special_tokens": r.spaces_between_special_tokens,
            "seed": r.seed,
            "stream_interval": r.stream_interval,
            **self.constraint(),
        }
        return sampling_params(d, param="request", names=self.api_names)

    def check_common(self) -> None:
        self.ctx.check_model(self.req.model)
        reject_unsupported(self.req)
        if self.req.structured_outputs is not None:
            try:
                reject_unsupported(self.req.structured_outputs)
            except ApiError as err:
                raise ApiError(400, f"'structured_outputs.{err.param}' is not supported by this server",
                               param=f"structured_outputs.{err.param}") from err
        if not 1 <= self.req.n <= MAX_N:
            raise ApiError(400, f"n must be in [1, {MAX_N}], got {self.req.n}", param="n")
        self.check_prompt_logprobs()
        best_of = self.req.best_of
        if best_of is not None and best_of < self.req.n:  # as OpenAI and vLLM answer
            raise ApiError(400, f"best_of must be at least n ({self.req.n}), got {best_of}", param="best_of")
        if best_of is not None and best_of > self.req.n:  # best_of == n: every sample is returned anyway
            raise ApiError(400, "'best_of' greater than 'n' is not supported by this server", param="best_of")
        if self.req.stream_options is not None and not self.req.stream:  # as OpenAI and vLLM answer
            raise ApiError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")
        if self.req.thinking_token_budget not in (None, -1):
            raise ApiError(400, "'thinking_token_budget' is not supported by this server", param="thinking_token_budget")
        if self.req.request_id == "":
            raise ApiError(400, "request_id is empty (leave it out for an id of the server's)", param="request_id")
        if self.req.request_id is not None and self.req.rid not in (None, self.req.request_id):
            raise ApiError(400, "give rid or request_id (vLLM's name for it), not two different ids", param="request_id")

    def check_prompt_logprobs(self) -> None:
        """vLLM's ``prompt_logprobs``: -1 (the whole vocabulary) or >= 0, at most
        ``--max-logprobs``; streamed, only 0 (and none are sent), as vLLM answers."""
        k = self.req.prompt_logprobs
        if k is None:
            return
        k = self.req.prompt_logprobs = int(k)  # true is 1, as on vLLM
        if k < -1:
            raise ApiError(400, f"'prompt_logprobs' must be >= 0 or -1 (all), got {k}", param="prompt_logprobs")
        if self.req.stream and k != 0:
            raise ApiError(400, "'prompt_logprobs' are not available when 'stream' is true", param="prompt_logprobs")
        most = self.ctx.args.max_logprobs
        if most != -1 and self.prompt_top_logprobs > most:
            raise ApiError(400, f"Requested prompt logprobs of {self.prompt_top_logprobs}, which is greater than max "
                           f"allowed: {most} (--max-logprobs)", param="prompt_logprobs")

    @property
    def scores_prompt(self) -> bool:
        """vLLM's ``prompt_logprobs`` asked for, where they are sent (not streamed)."""
        return self.req.prompt_logprobs is not None and not self.req.stream

    @property
    def prompt_top_logprobs(self) -> int:
        """How many likeliest tokens vLLM's ``prompt_logprobs`` lists at each prompt token
        (-1: the vocabulary; not asked: 0)."""
        k = self.req.prompt_logprobs
        return self.ctx.limits.vocab_size if k == -1 else int(k or 0)

    def submit(self, prompts: list[list[int]], max_tokens: int | None, top_logprobs: int | None,
               prompt_logprobs: bool = False) -> list[ReqState]:
        """``n`` requests per prompt, prompt-major (choice index = prompt * n + k); with
        ``prompt_logprobs`` (or vLLM's field), the prompt's tokens' logprobs too (from its
        first token). ``top_logprobs``: the output's (None: no logprobs)."""
        ctx = self.ctx
        prompt_logprobs = prompt_logprobs or self.scores_prompt
        prompt_top = self.prompt_top_logprobs if self.scores_prompt else 0
        options = RequestOptions(stream=self.req.stream, return_logprob=top_logprobs is not None or prompt_logprobs,
                                 top_logprobs_num=top_logprobs or 0,
                                 namespace=cache_namespace(self.req.extra_key, self.req.cache_salt),
                                 logprob_start_len=0 if prompt_logprobs else -1,
                                 prompt_top_logprobs_num=max(top_logprobs or 0, prompt_top))
        requests = []
        prompts = [self.truncated(ids) for ids in prompts]
        for ids in prompts:
            room = ctx.max_sequence_len - len(ids)
            max_new = max(room, 0) if max_tokens is None else max_tokens
            if max_new < 0:
                raise ApiError(400, "max_tokens must be >= 0", param="max_tokens")
            params = dataclasses.replace(self.params(max_new), n=self.req.n)  # n checked in check_common
            with bad_input_as_400(self.prompt_field, self.api_names):
                samples = build_requests([ids], [params], options, ctx.limits, prompt_field=self.prompt_field)
            requests += samples
        # the prompt scored once, not once per sample (n 128 of an 8k-token prompt took 19 minutes),
        # unless streamed or the samples have the client's ids (``score_each_prompt_once``)
        samples_per_prompt = [self.req.n] * len(prompts)
        rid = self.req.rid if self.req.rid is not None else self.req.request_id
        ids = request_ids(rid, samples_per_prompt) if rid is not None else self.header_ids(samples_per_prompt)
        requests, self.prompt_source = score_each_prompt_once(requests, each_own=bool(self.req.stream) or ids is not None)
        self.num_prompts, self.prompts = len(prompts), prompts
        self.states = ctx.submit_group(requests, ids, self.request)
        return self.states

    def header_ids(self, samples_per_prompt: list[int]) -> list[tuple[str, str]] | None:
        """The requests' ids from the X-Request-Id header; None (ids of the server's) where
        there is none or one of them is in use (a trace id sent with parallel calls: the
        header then names only the answer). Read right before submitting, with no wait between."""
        ids = request_ids(self.header_id, samples_per_prompt)
        if ids is None or any(rid in self.ctx.client.states for rid, _ in ids):
            return None
        return ids

    def prompt_state(self, index: int) -> ReqState:
        """The request whose prompt logprobs choice ``index`` reports: the first
        sample of its prompt, unless each sample scored the prompt itself (``submit``)."""
        return self.states[self.prompt_source[index]]

    def vllm_prompt_logprobs(self, index: int) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs`` of choice ``index``'s prompt (``prompt_logprobs.render``),
        rendered once for the n samples of a prompt."""
        prompt = index // self.req.n
        if prompt not in self.rendered_prompt_logprobs:
            self.rendered_prompt_logprobs[prompt] = render(self.prompt_state(index), self.prompt_ids_of(index),
                                                           self.prompt_top_logprobs, self.ctx.tokenizer)
        return self.rendered_prompt_logprobs[prompt]

    @property
    def keeps_prompt_end(self) -> bool:
        """``truncate_prompt_tokens`` keeps the prompt's end (the default side)."""
        return self.req.truncate_prompt_tokens is not None and self.req.truncation_side != "right"

    def truncated(self, ids: list[int]) -> list[int]:
        """vLLM's ``truncate_prompt_tokens``: the prompt's last N tokens (``truncation_side``
        "right": its first N); -1: as many as the context holds."""
        n, side = self.req.truncate_prompt_tokens, self.req.truncation_side
        if n is None:
            return ids
        if n == -1:
            n = self.ctx.max_sequence_len
        if n < 1:
            raise ApiError(400, f"truncate_prompt_tokens must be -1 (the context length) or >= 1, got {n}",
                           param="truncate_prompt_tokens")
        if n >= len(ids):
            return ids  # (a PartOfPrompt stays one: its count is not the whole prompt's)
        return ids[:n] if side == "right" else ids[-n:]

    @property
    def prompt_field(self) -> str:
        """The request field the prompt came in, for its errors."""
        return "prompt"

    def prompt_ids_of(self, index: int) -> list[int]:
        """The token ids of choice ``index``'s prompt."""
        return self.prompts[index // self.req.n]

    def token_name(self, token_id: int) -> str:
        """A token as logprobs name it: its text (a token holding part of a character, its
        bytes), or with vLLM's ``return_tokens_as_token_ids`` ``token_id:N``."""
        if self.req.return_tokens_as_token_ids:
            return f"token_id:{token_id}"
        return self.ctx.tokenizer.token_bytes.name(token_id)

    def usage(self, states: list[ReqState]) -> dict[str, Any]:
        n = self.req.n
        groups = [states[i * n : (i + 1) * n] for i in range(len(states) // n)]
        prompt = sum(g[0].prompt_tokens for g in groups)
        cached = sum(min(s.cached_tokens for s in g) for g in groups)  # siblings reuse the first one's prefill
        return usage_body(prompt, sum(len(s.output_ids) for s in states), cached)

    async def respond(self, states: list[ReqState]) -> Response:
        if not self.req.stream:
            await wait_all(self.ctx.client, states, self.request)
            for s in states:
                err = error_of(s, self.api_names)
                if err is not None:
                    raise err
            choices = [self.with_ids(i, s, {**self.choice(i, s), **self.stop_fields(s)}) for i, s in enumerate(states)]
            body = {
                "id": self.id,
                "object": self.object_name,
                "created": self.created,
                "model": self.ctx.model_name,
                "choices": choices,
                "usage": self.usage(states),
                **self.answer_fields(states),
            }
            if sglext := self.sglext(states):
                body["sglext"] = sglext
            return JsonResponse(body)
        return StreamingResponse(self.events(states), media_type="text/event-stream")

    def stop_fields(self, state: ReqState) -> dict[str, Any]:
        """What ended a finished choice: vLLM's ``stop_reason`` (the stop string or the
        ``stop_token_ids`` id that matched; null for the end-of-sequence token or a length
        limit) and SGLang's ``matched_stop`` (the string or any token id that matched)."""
        reason = state.finished_reason or {}
        matched = reason.get("matched")
        stop_ids = self.req.stop_token_ids or []
        return {"stop_reason": matched if isinstance(matched, str) or matched in stop_ids else None,
                "matched_stop": matched}

    def with_ids(self, index: int, state: ReqState, choice: dict[str, Any]) -> dict[str, Any]:
        """A whole answer's choice with the token ids asked for (``return_token_ids``)."""
        if self.req.return_token_ids:
            choice["token_ids"] = list(state.output_ids)
        return choice

    def answer_fields(self, states: list[ReqState]) -> dict[str, Any]:
        """Fields of a whole answer besides OpenAI's (the routes add theirs)."""
        return {}

    def sglext(self, states: list[ReqState]) -> dict[str, Any]:
        """SGLang's ``sglext`` object of the answer (empty: none): the cache hit of the first
        choice's prompt, where there was one (``return_cached_tokens_details``)."""
        cached = states[0].cached_tokens if states else 0
        if self.req.return_cached_tokens_details and cached:
            return {"cached_tokens_details": {"device": cached, "host": 0}}
        return {}

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None, **fields: Any) -> bytes:
        body: dict[str, Any] = {
            "id": self.id,
            "object": self.object_name + ".chunk" if self.object_name == "chat.completion" else self.object_name,
            "created": self.created,
            "model": self.ctx.model_name,
            "choices": choices,
            **fields,
        }
        if self.include_usage:
            body["usage"] = usage
        return sse(body)

    @property
    def include_usage(self) -> bool:
        opts = self.req.stream_options
        return bool(opts and opts.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's ``stream_options.continuous_usage_stats``: usage so far in every chunk, that
        of the chunk's own choice (its prompt, its tokens so far), as vLLM counts it."""
        opts = self.req.stream_options
        return self.include_usage and bool(opts and opts.continuous_usage_stats)

    async def events(self, states: list[ReqState]) -> AsyncIterator[bytes]:
        sent_text = [0] * len(states)
        sent_tokens = [0] * len(states)
        sent_ids = [0] * len(states)  # return_token_ids: each chunk carries the ids new since the last
        def so_far(i: int | None) -> dict[str, Any] | None:
            """Choice ``i``'s usage so far (None: all choices') where every chunk carries one."""
            if not self.continuous_usage:
                return None
            if i is None:
                return self.usage(states)
            return usage_body(states[i].prompt_tokens, len(states[i].output_ids), states[i].cached_tokens)

        for head in self.stream_start(len(states)):
            yield self.chunk([head], so_far(head["index"]), **self.opening_fields(head["index"]))
        async with contextlib.aclosing(merged_updates(self.ctx.client, states)) as updates:
            async for i, s in updates:
                err = error_of(s, self.api_names)
                if err is not None:
                    yield sse(err.body())
                    continue
                text = s.text[sent_text[i] :]
                finish = finish_reason_of(s)
                if not text and finish is None:
                    continue
                logprobs = self.logprobs(s, sent_tokens[i], len(s.output_token_logprobs), sent_text[i])
                sent_text[i] = len(s.text)
                choice = self.stream_choice(i, s, text, finish, logprobs)
                if choice is not None:  # None: text held back; its tokens' logprobs go with the next chunk
                    if choice["finish_reason"] is not None:
                        choice.update(self.stop_fields(s))
                    sent_tokens[i] = len(s.output_token_logprobs)
                    if self.req.return_token_ids:
                        choice["token_ids"] = list(s.output_ids[sent_ids[i]:])
                        sent_ids[i] = len(s.output_ids)
                    yield self.chunk([choice], so_far(i))
        if sglext := self.sglext(states):  # SGLang sends it in a chunk of its own, after the choices
            yield self.chunk([], so_far(None), sglext=sglext)
        if self.include_usage:
            yield self.chunk([], self.usage(states))
        yield SSE_DONE

    def opening_fields(self, index: int) -> dict[str, Any]:
        """Fields of the chunk that opens choice ``index``'s stream besides OpenAI's."""
        return {}

    # subclass hooks
    def choice(self, index: int, state: ReqState) -> dict[str, Any]:
        raise NotImplementedError

    def stream_choice(self, index: int, state: ReqState, text: str, finish: str | None,
                      logprobs: Any) -> dict[str, Any] | None:
        """The chunk choice for new ``text`` of choice ``index`` (None: nothing to send yet)."""
        return self.delta_choice(index, text, finish, logprobs)

    def stream_start(self, num_choices: int) -> list[dict[str, Any]]:
        return []

    def delta_choice(self, index: int, text: str, finish: str | None, logprobs: Any) -> dict[str, Any]:
        raise NotImplementedError

    def logprobs(self, state: ReqState, start: int, end: int, text_offset: int) -> Any:
        raise NotImplementedError
