"""``/v1/chat/completions``: messages in, an assistant message out, with tool calls and
reasoning split off (``chat_answer.py``) and the prompt built by ``tools/chat_prompt.py``."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from fastapi.responses import Response

from runtime.request_builder import check_prompt
from runtime.server import legacy_functions
from runtime.server.chat_answer import ChatAnswer
from runtime.server.context import bad_input_as_400
from runtime.server.openai_handler import OpenAIHandler, finish_reason_of
from runtime.server.prompt_logprobs import api_logprob
from runtime.server.protocol import ApiError
from runtime.server.protocol_openai import ChatCompletionRequest
from runtime.server.reasoning import PARSERS as REASONING_PARSERS
from runtime.server.responses import JsonResponse, native_output
from runtime.server.scheduler_client import ReqState
from runtime.server.tools.chat_prompt import ChatPrompt, render_chat
from runtime.server.tools.choice import call_rule


class ChatCompletion(OpenAIHandler):
    object_name = "chat.completion"
    id_prefix = "chatcmpl"
    req: ChatCompletionRequest
    tool_ebnf: str | None = None
    named_function = False  # tool_choice names one function: its call ends with "stop", as OpenAI's does
    FIELD_NAMES: ClassVar[dict[str, str]] = {}  # a chat field -> its name in the request (see ResponseCreation)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.legacy_functions = self.req.functions is not None  # answered in the deprecated shape
        self.req = legacy_functions.as_tools(self.req)
        self.field_names = dict(self.FIELD_NAMES)  # errors name the fields the client sent
        if self.legacy_functions:
            self.field_names.update(tools="functions", tool_choice="function_call")
        name = self.ctx.http.reasoning_parser
        self.reasoning = REASONING_PARSERS[name] if name and self.req.separate_reasoning else None
        self.answer = ChatAnswer(None, self.reasoning, self.req.stream_reasoning, include_reasoning=self.req.include_reasoning)
        self.prompt_text = ""

    async def run(self) -> Response:
        return await self.respond(await self.start())

    async def start(self) -> list[ReqState]:
        """Check the request, build its prompt and submit its ``n`` requests."""
        r = self.req
        self.check_request()
        prompts = [await self.prompt_ids()]
        # both given (some client wrappers do): the newer field wins, as on vLLM and SGLang
        max_tokens = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
        return self.submit(prompts, max_tokens, (r.top_logprobs or 0) if r.logprobs else None)

    exact_prompt = False  # /tokenize, input_tokens: all of a prompt's ids, however long (see ctx.encode)

    async def prompt_ids(self) -> list[int]:
        """The prompt's token ids: the rendered chat's, encoded as the template wrote it (its
        own BOS, no second one: ``add_special_tokens`` false unless asked for, as SGLang and
        vLLM do), or SGLang's ``input_ids`` as given (the messages still give the tool
        grammar and parser)."""
        text = (await asyncio.to_thread(self.prompt)).text  # many tools take a while: not on the event loop
        if self.req.input_ids is not None:  # checked by check_request
            if self.req.return_prompt_text:
                self.prompt_text = self.ctx.tokenizer.decode(self.req.input_ids, False)
            return list(self.req.input_ids)
        return (await self.ctx.encode([text], bool(self.req.add_special_tokens), for_generation=not self.exact_prompt,
                                      keep_end=self.keeps_prompt_end))[0]

    async def render(self) -> Response:
        """``/v1/chat/completions/render``: what ``run`` would send to the engine, without
        sending it: the prompt text, the output constraint as native sampling fields (the
        tool-call grammar as ``ebnf``) and the parser that reads calls from the answer. A
        native client (the DSL) generates with these through ``/generate``."""
        self.check_request()
        prompt = await asyncio.to_thread(self.prompt)
        return JsonResponse({
            "text": prompt.text,
            "sampling_params": {k: v for k, v in self.constraint().items() if v is not None},
            "tool_call_parser": prompt.tool_parser.name if prompt.tool_parser else None,
        })

    def check_request(self) -> None:
        r = self.req
        self.check_common()
        for i, tool in enumerate(r.tools or []):  # paths written as the body's validation errors write them
            if tool.type != "function":
                raise ApiError(400, f"tools[{i}].type: only function tools are supported by this server, got "
                                    f"'{tool.type}'", param=f"tools[{i}].type")
            if tool.function is None:
                raise ApiError(400, f"tools[{i}].function: a function tool needs its 'function' object",
                               param=f"tools[{i}].function")
        with bad_input_as_400("tool_choice"):
            self.named_function = call_rule([t.model_dump() for t in r.tools] if r.tools else None, r.tool_choice).single
        if r.web_search_options is not None:  # even {} asks for a search
            raise ApiError(400, "'web_search_options' is not supported by this server", param="web_search_options")
        if r.modalities not in (None, ["text"]):
            raise ApiError(400, "only the text modality is supported", param="modalities")
        for name in ("max_tokens", "max_completion_tokens"):  # completions' echo may score with 0; a chat may not
            value = getattr(r, name)
            if value is not None and value < 1:
                raise ApiError(400, f"'{name}' must be at least 1, got {value}", param=name)
        for i, m in enumerate(r.messages):  # OpenAI's schema: only an assistant turn may go without
            if m.content is None and m.role in ("system", "developer", "user", "tool"):
                raise ApiError(400, f"messages[{i}] ({m.role}) has no 'content'", param=f"messages[{i}].content")
        if r.top_logprobs and not r.logprobs:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        for name in ("return_prompt_token_ids", "return_meta_info"):  # SGLang's rule: whole answers only
            if r.stream and getattr(r, name):
                raise ApiError(400, f"'{name}' is not supported with streaming (ask for stream: false, or "
                                    "'return_token_ids', which streams)", param=name)
        if r.input_ids is not None:
            with bad_input_as_400("input_ids"):
                check_prompt(r.input_ids, self.ctx.limits, "input_ids")
        if not r.include_reasoning and self.reasoning is not None:  # vLLM hides them; here: say so
            shown = [name for name in ("logprobs", "return_token_ids", "return_meta_info", "return_output_ids_in_sglext")
                     if getattr(r, name)]
            if shown:
                raise ApiError(400, f"include_reasoning false drops the reasoning, whose tokens '{shown[0]}' would "
                                    "show: ask for one or the other", param="include_reasoning")

    def prompt(self) -> ChatPrompt:
        """The prompt text; with tools (or tool turns in the history) through a template that
        can show them, and the grammar that keeps the model's calls valid."""
        r = self.req
        tools = [t.model_dump(exclude_none=True) for t in r.tools] if r.tools else None
        messages = [m.as_template_dict() for m in r.messages]
        with bad_input_as_400("messages", self.field_names):
            prompt = render_chat(
                self.ctx.tokenizer.hf, messages, tools, tool_choice=r.tool_choice,
                parallel_tool_calls=r.parallel_tool_calls, chat_template=self.ctx.chat_template_override,
                tool_call_parser=self.ctx.http.tool_call_parser,
                other_constraint=self.constraint_source is not None,
                answer_schema=self.answer_schema(),
                add_generation_prompt=r.add_generation_prompt, continue_final_message=r.continue_final_message,
                template_kwargs=r.chat_template_kwargs, reasoning_effort=r.reasoning_effort,
                reasoning_model=self.ctx.http.reasoning_parser is not None,
            )
        self.tool_ebnf, self.prompt_text = prompt.tool_ebnf, prompt.text
        if not prompt.thinking:  # the template was told not to think: nothing to split off (as SGLang)
            self.reasoning = None
        self.answer = ChatAnswer(prompt.tool_parser, self.reasoning, self.req.stream_reasoning,
                                 calls_finish="stop" if self.named_function else "tool_calls",
                                 include_reasoning=self.req.include_reasoning)
        return prompt

    def constraint(self) -> dict[str, Any]:
        fields = super().constraint()
        if self.tool_ebnf is not None:  # it holds the response_format's schema too, where there is one
            fields.update(ebnf=self.tool_ebnf, json_schema=None)
        return fields

    def choice(self, index: int, state: ReqState) -> dict[str, Any]:
        message, finish = self.answer.message(state.text, finish_reason_of(state))
        if self.legacy_functions:
            message, finish = legacy_functions.answer_message(message, finish)
        return {
            "index": index,
            "message": message,
            "logprobs": self.logprobs(state, 0, len(state.output_token_logprobs), 0),
            "finish_reason": finish,
        }

    @property
    def prompt_field(self) -> str:
        return "messages" if self.req.input_ids is None else "input_ids"

    def with_ids(self, index: int, state: ReqState, choice: dict[str, Any]) -> dict[str, Any]:
        """Token ids as vLLM's ``return_token_ids`` gives them (``token_ids``) and as SGLang's
        chat route does (``prompt_token_ids``, ``response_token_ids``; its ``meta_info``: the
        ``/generate`` one)."""
        r = self.req
        super().with_ids(index, state, choice)
        if r.return_token_ids or r.return_prompt_token_ids:
            choice["prompt_token_ids"] = self.prompt_ids_of(index)
        if r.return_token_ids:
            choice["response_token_ids"] = list(state.output_ids)
        if r.return_meta_info:
            choice["meta_info"] = native_output(state, self.ctx.tokenizer, True)["meta_info"]
        return choice

    def answer_fields(self, states: list[ReqState]) -> dict[str, Any]:
        fields = self.opening_fields(0)
        if self.scores_prompt:  # one prompt: beside the choices, as vLLM has it
            fields["prompt_logprobs"] = self.vllm_prompt_logprobs(0)
        return fields

    def opening_fields(self, index: int) -> dict[str, Any]:
        """vLLM's: the prompt's ids (``return_token_ids``) and text (``return_prompt_text``)
        beside the choices, in a stream with each choice's opening chunk."""
        fields: dict[str, Any] = {}
        if self.req.return_token_ids:
            fields["prompt_token_ids"] = self.prompt_ids_of(index)
        if self.req.return_prompt_text:
            fields["prompt_text"] = self.prompt_text
        return fields

    def sglext(self, states: list[ReqState]) -> dict[str, Any]:
        out = super().sglext(states)
        if self.req.return_input_ids_in_sglext:
            out["input_ids"] = self.prompt_ids_of(0)
        if self.req.return_output_ids_in_sglext:
            out["output_ids"] = [list(s.output_ids) for s in states]
        return out

    def stream_choice(self, index: int, state: ReqState, text: str, finish: str | None,
                      logprobs: Any) -> dict[str, Any] | None:
        if self.answer.is_plain:
            return self.delta_choice(index, text, finish, logprobs)
        delta, finish = self.answer.delta(index, state.text, finish)
        if delta is None:
            return None
        if self.legacy_functions:
            delta, finish = legacy_functions.answer_delta(delta, finish)
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def stream_start(self, num_choices: int) -> list[dict[str, Any]]:
        # as OpenAI's: no content yet where the answer may be tool calls (a client that adds
        # the deltas up keeps null for an answer that is calls only, as the whole answer has)
        content = None if self.answer.tool_parser is not None else ""
        return [
            {"index": i, "delta": {"role": "assistant", "content": content}, "logprobs": None, "finish_reason": None}
            for i in range(num_choices)
        ]

    def delta_choice(self, index: int, text: str, finish: str | None, logprobs: Any) -> dict[str, Any]:
        delta = {"content": text} if text else {}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def logprobs(self, state: ReqState, start: int, end: int, text_offset: int) -> Any:
        if not self.req.logprobs:
            return None
        token_bytes = self.ctx.tokenizer.token_bytes

        def entry(lp: float, tid: int) -> dict[str, Any]:  # a token with part of a character: its own bytes
            return {"token": self.token_name(tid), "logprob": api_logprob(lp), "bytes": list(token_bytes.of(tid))}

        content = []
        for k in range(start, end):
            lp, tid = state.output_token_logprobs[k]
            top = state.output_top_logprobs[k] or []
            content.append({**entry(lp, tid), "top_logprobs": [entry(v, t) for v, t in top]})
        return {"content": content}
