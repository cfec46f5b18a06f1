"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from runtime.request_builder import build_requests
from runtime.request_options import RequestOptions
from runtime.sampling.params import MAX_N, SamplingParams
from runtime.server.context import ServerContext, bad_input_as_400, read_body, sampling_params
from runtime.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    reject_unsupported,
)
from runtime.server.reasoning import PARSERS as REASONING_PARSERS
from runtime.server.reasoning import StreamingReasoning
from runtime.server.responses import SSE_DONE, JsonResponse, error_of, merged_updates, sse, wait_all
from runtime.server.scheduler_client import ReqState
from runtime.server.tools.constraint import tool_grammar
from runtime.server.tools.parsers import (
    StreamingToolParser,
    ToolCallParser,
    get_parser,
    parser_for_template,
)
from runtime.server.tools.template import render, tool_template

# Sampling fields as OpenAI clients call them, for error messages.
_OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "json_schema": "response_format"}


def add_routes(app: FastAPI, ctx: ServerContext) -> None:
    def card() -> dict[str, Any]:
        return {
            "id": ctx.model_name,
            "object": "model",
            "created": int(ctx.started_at),
            "owned_by": "forkserve",
            "root": ctx.model_path,
            "max_model_len": ctx.max_context_len,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        ctx.check_model(model)
        return card()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = await read_body(request, CompletionRequest, ctx.http.max_request_bytes)
        return await Completion(ctx, req, request).run()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req: ChatCompletionRequest = await read_body(request, ChatCompletionRequest, ctx.http.max_request_bytes)
        return await ChatCompletion(ctx, req, request).run()


def _finish_reason(state: ReqState) -> str | None:
    reason = state.finished_reason
    if reason is None:
        return None
    return {"stop": "stop", "length": "length"}.get(reason["type"], reason["type"])


class _OpenAIHandler:
    """The parts completions and chat share: sampling params, submission, usage, streaming."""

    object_name = ""
    id_prefix = ""

    def __init__(self, ctx: ServerContext, req: Any, request: Request) -> None:
        self.ctx, self.req, self.request = ctx, req, request
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

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
            "ignore_eos": r.ignore_eos,
            "skip_special_tokens": r.skip_special_tokens,
            "no_stop_trim": r.no_stop_trim or r.include_stop_str_in_output,
            "spaces_between_special_tokens": r.spaces_between_special_tokens,
            "seed": r.seed,
            **self.constraint(),
        }
        return sampling_params(d, param="request", names=_OPENAI_NAMES)

    def constraint(self) -> dict[str, Any]:
        """The request's output constraint as sampling fields: ``response_format`` becomes a
        ``json_schema`` (``json_object``: any object), ``regex`` and ``ebnf`` pass through."""
        r = self.req
        regex = r.regex or r.guided_regex
        if r.guided_choice:
            regex = "|".join(re.escape(c) for c in r.guided_choice)
        fields: dict[str, Any] = {"regex": regex, "ebnf": r.ebnf or r.guided_grammar}
        if r.guided_json is not None:
            fields["json_schema"] = r.guided_json if isinstance(r.guided_json, str) else json.dumps(r.guided_json)
        fmt = r.response_format
        if fmt is None or fmt.type == "text":
            return fields
        if fmt.type == "json_object":
            schema: dict[str, Any] = {"type": "object"}
        elif fmt.json_schema is None:
            raise ApiError(400, "response_format of type json_schema needs a 'json_schema' object", param="response_format")
        else:
            schema = fmt.json_schema.schema_ or {}  # no schema: any JSON value
        return {**fields, "json_schema": json.dumps(schema)}

    def check_common(self) -> None:
        self.ctx.check_model(self.req.model)
        reject_unsupported(self.req, self.req.UNSUPPORTED)
        if self.req.best_of not in (None, 1):
            raise ApiError(400, "'best_of' is not supported by this server", param="best_of")
        if not 1 <= self.req.n <= MAX_N:
            raise ApiError(400, f"n must be in [1, {MAX_N}], got {self.req.n}", param="n")

    def submit(self, prompts: list[list[int]], max_tokens: int | None, top_logprobs: int | None) -> list[ReqState]:
        """``n`` requests per prompt, prompt-major (choice index = prompt * n + k)."""
        ctx = self.ctx
        options = RequestOptions(stream=self.req.stream, return_logprob=top_logprobs is not None,
                                 top_logprobs_num=top_logprobs or 0, namespace=self.req.extra_key or self.req.cache_salt)
        requests = []
        for ids in prompts:
            room = min(ctx.max_context_len, ctx.max_total_tokens) - len(ids)
            max_new = max(room, 0) if max_tokens is None else max_tokens
            if max_new < 0:
                raise ApiError(400, "max_tokens must be >= 0", param="max_tokens")
            params = dataclasses.replace(self.params(max_new), n=self.req.n)  # n checked in check_common
            with bad_input_as_400("prompt", _OPENAI_NAMES):
                requests += build_requests([ids], [params], options, ctx.limits, prompt_field="prompt",
                                           within_context=True)
        self.num_prompts = len(prompts)
        return ctx.submit_group(requests)

    def usage(self, states: list[ReqState]) -> dict[str, Any]:
        n = self.req.n
        groups = [states[i * n : (i + 1) * n] for i in range(len(states) // n)]
        prompt = sum(g[0].prompt_tokens for g in groups)
        cached = sum(max(s.cached_tokens for s in g) for g in groups)
        completion = sum(len(s.output_ids) for s in states)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    async def respond(self, states: list[ReqState]) -> Response:
        if not self.req.stream:
            await wait_all(self.ctx.client, states, self.request)
            for s in states:
                err = error_of(s, _OPENAI_NAMES)
                if err is not None:
                    raise err
            choices = [self.choice(i, s) for i, s in enumerate(states)]
            body = {
                "id": self.id,
                "object": self.object_name,
                "created": self.created,
                "model": self.ctx.model_name,
                "choices": choices,
                "usage": self.usage(states),
            }
            return JsonResponse(body)
        return StreamingResponse(self.events(states), media_type="text/event-stream")

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": self.id,
            "object": self.object_name + ".chunk" if self.object_name == "chat.completion" else self.object_name,
            "created": self.created,
            "model": self.ctx.model_name,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = usage
        return sse(body)

    @property
    def include_usage(self) -> bool:
        opts = self.req.stream_options
        return bool(opts and opts.include_usage)

    async def events(self, states: list[ReqState]) -> AsyncIterator[bytes]:
        sent_text = [0] * len(states)
        sent_tokens = [0] * len(states)
        for head in self.stream_start(len(states)):
            yield self.chunk([head])
        async with contextlib.aclosing(merged_updates(self.ctx.client, states)) as updates:
            async for i, s in updates:
                err = error_of(s, _OPENAI_NAMES)
                if err is not None:
                    yield sse(err.body())
                    continue
                text = s.text[sent_text[i] :]
                finish = _finish_reason(s)
                if not text and finish is None:
                    continue
                logprobs = self.logprobs(s, sent_tokens[i], len(s.output_token_logprobs), sent_text[i])
                sent_text[i], sent_tokens[i] = len(s.text), len(s.output_token_logprobs)
                choice = self.stream_choice(i, s, text, finish, logprobs)
                if choice is not None:
                    yield self.chunk([choice])
        if self.include_usage:
            yield self.chunk([], self.usage(states))
        yield SSE_DONE

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


class Completion(_OpenAIHandler):
    object_name = "text_completion"
    id_prefix = "cmpl"

    async def run(self) -> Response:
        r = self.req
        self.check_common()
        reject_unsupported(r, ("suffix",))
        if r.echo and r.logprobs is not None:
            raise ApiError(400, "'echo' together with 'logprobs' is not supported", param="echo")
        prompt = r.prompt
        texts: list[str] | None = None
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], str)):
            texts = [prompt] if isinstance(prompt, str) else list(prompt)
            prompts = await self.ctx.encode(texts)
        else:
            prompts = list(prompt) if prompt and isinstance(prompt[0], list) else [list(prompt)]
        if not prompts:
            raise ApiError(400, "'prompt' is an empty list", param="prompt")
        states = self.submit(prompts, r.max_tokens, r.logprobs)  # checks token ids
        # Only checked token ids are decoded (for echo).
        self.prompt_texts = texts or ([self.ctx.tokenizer.decode(p, False) for p in prompts] if r.echo else [])
        return await self.respond(states)

    def echo(self, index: int) -> str:
        return self.prompt_texts[index // self.req.n] if self.req.echo else ""

    def choice(self, index: int, state: ReqState) -> dict[str, Any]:
        return {
            "index": index,
            "text": self.echo(index) + state.text,
            "logprobs": self.logprobs(state, 0, len(state.output_token_logprobs), 0),
            "finish_reason": _finish_reason(state),
        }

    def stream_start(self, num_choices: int) -> list[dict[str, Any]]:
        if not self.req.echo:
            return []
        return [{"index": i, "text": self.echo(i), "logprobs": None, "finish_reason": None} for i in range(num_choices)]

    def delta_choice(self, index: int, text: str, finish: str | None, logprobs: Any) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def logprobs(self, state: ReqState, start: int, end: int, text_offset: int) -> Any:
        if self.req.logprobs is None:
            return None
        tok = self.ctx.tokenizer
        tokens, lps, tops, offsets = [], [], [], []
        offset = text_offset
        for k in range(start, end):
            lp, tid = state.output_token_logprobs[k]
            piece = tok.id_to_text(tid)
            tokens.append(piece)
            lps.append(lp)
            top = state.output_top_logprobs[k] or []
            tops.append({tok.id_to_text(t): v for v, t in top} if self.req.logprobs else None)
            offsets.append(offset)
            offset += len(piece)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


class ChatCompletion(_OpenAIHandler):
    object_name = "chat.completion"
    id_prefix = "chatcmpl"
    tool_parser: ToolCallParser | None = None
    tool_ebnf: str | None = None

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.tool_streams: dict[int, StreamingToolParser] = {}
        self.reasoning_streams: dict[int, StreamingReasoning] = {}
        name = self.ctx.http.reasoning_parser
        self.reasoning = REASONING_PARSERS[name] if name and self.req.separate_reasoning else None

    async def run(self) -> Response:
        r = self.req
        self.check_common()
        reject_unsupported(r, r.CHAT_UNSUPPORTED)
        tools = [t.model_dump(exclude_none=True) for t in r.tools] if r.tools else None
        self.check_tool_choice(tools)
        if r.web_search_options is not None:  # even {} asks for a search
            raise ApiError(400, "'web_search_options' is not supported by this server", param="web_search_options")
        if r.modalities not in (None, ["text"]):
            raise ApiError(400, "only the text modality is supported", param="modalities")
        if any(m.function_call for m in r.messages):
            raise ApiError(400, "'function_call' in messages is the deprecated form; send 'tool_calls'", param="messages")
        if r.max_tokens is not None and r.max_completion_tokens is not None and r.max_tokens != r.max_completion_tokens:
            raise ApiError(400, "give max_tokens or max_completion_tokens, not two different values", param="max_tokens")
        if r.top_logprobs and not r.logprobs:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        messages = [m.as_template_dict() for m in r.messages]
        text = self.render_prompt(messages, tools)
        prompts = await self.ctx.encode([text])
        max_tokens = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
        top = (r.top_logprobs or 0) if r.logprobs else None
        return await self.respond(self.submit(prompts, max_tokens, top))

    def check_tool_choice(self, tools: list[dict[str, Any]] | None) -> None:
        choice = self.req.tool_choice
        if choice in (None, "none", "auto"):
            return
        if not tools:
            raise ApiError(400, f"tool_choice {choice!r} needs 'tools'", param="tool_choice")
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
            if name not in {t["function"]["name"] for t in tools}:
                raise ApiError(400, "tool_choice must name one of the given tools: "
                               '{"type": "function", "function": {"name": ...}}', param="tool_choice")

    def render_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """The prompt text; with tools (or tool turns in the history) through a template that
        can show them, and the grammar that keeps the model's calls valid."""
        r, hf, override = self.req, self.ctx.tokenizer.hf, self.ctx.chat_template_override
        uses_tools = bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
        kwargs = dict(add_generation_prompt=r.add_generation_prompt and not r.continue_final_message,
                      continue_final_message=r.continue_final_message, **(r.chat_template_kwargs or {}))
        try:
            template = tool_template(hf, override) if uses_tools else (override or hf.chat_template)
            if not template:
                raise ValueError("this model has no chat template; use completions instead of chat")
            text = render(hf, template, messages, tools, **kwargs)
        except ValueError as err:
            raise ApiError(400, str(err), param="messages") from err
        except Exception as err:  # jinja errors name the template's complaint
            raise ApiError(400, f"the chat template rejected the messages: {err}", param="messages") from err
        if tools and r.tool_choice != "none":
            if r.response_format is not None or r.regex or r.ebnf:
                raise ApiError(400, "'tools' cannot be combined with another output constraint", param="tools")
            name = self.ctx.http.tool_call_parser
            self.tool_parser = get_parser(name) if name != "auto" else parser_for_template(template)
            self.tool_ebnf = tool_grammar(tools, r.tool_choice, self.tool_parser.name,
                                          parallel=r.parallel_tool_calls is not False)
        return text

    def constraint(self) -> dict[str, Any]:
        fields = super().constraint()
        if self.tool_ebnf is not None:
            fields["ebnf"] = self.tool_ebnf
        return fields

    def choice(self, index: int, state: ReqState) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": state.text}
        finish = _finish_reason(state)
        if self.reasoning is not None:
            reasoning, message["content"], _ = self.reasoning.split(state.text)
            message["reasoning_content"] = reasoning or None
        if self.tool_parser is not None:
            content, calls = self.tool_parser.parse(message["content"])
            if calls:
                message.update(content=content or None, tool_calls=[c.as_openai() for c in calls])
                finish = "tool_calls" if finish == "stop" else finish
        return {
            "index": index,
            "message": message,
            "logprobs": self.logprobs(state, 0, len(state.output_token_logprobs), 0),
            "finish_reason": finish,
        }

    def stream_choice(self, index: int, state: ReqState, text: str, finish: str | None,
                      logprobs: Any) -> dict[str, Any] | None:
        if self.tool_parser is None and self.reasoning is None:
            return self.delta_choice(index, text, finish, logprobs)
        finished = finish is not None
        reasoning, content, calls, answer = "", text, [], state.text
        if self.reasoning is not None:
            thinking = self.reasoning_streams.setdefault(index, StreamingReasoning(self.reasoning))
            reasoning, content = thinking.feed(state.text, finished)
            answer = thinking.content
        if self.tool_parser is not None:
            stream = self.tool_streams.setdefault(index, StreamingToolParser(self.tool_parser))
            content, calls = stream.feed(answer, finished)
            if finish == "stop" and stream.sent_calls:
                finish = "tool_calls"
        if not (reasoning or content or calls or finished):
            return None
        delta: dict[str, Any] = {"reasoning_content": reasoning} if reasoning else {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def stream_start(self, num_choices: int) -> list[dict[str, Any]]:
        return [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for i in range(num_choices)
        ]

    def delta_choice(self, index: int, text: str, finish: str | None, logprobs: Any) -> dict[str, Any]:
        delta = {"content": text} if text else {}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def logprobs(self, state: ReqState, start: int, end: int, text_offset: int) -> Any:
        if not self.req.logprobs:
            return None
        tok = self.ctx.tokenizer

        def entry(lp: float, tid: int) -> dict[str, Any]:
            piece = tok.id_to_text(tid)
            return {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8"))}

        content = []
        for k in range(start, end):
            lp, tid = state.output_token_logprobs[k]
            top = state.output_top_logprobs[k] or []
            content.append({**entry(lp, tid), "top_logprobs": [entry(v, t) for v, t in top]})
        return {"content": content}
