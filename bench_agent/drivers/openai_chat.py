"""A DSL backend over any OpenAI-compatible chat server (vLLM, SGLang, llama.cpp's
server, forkserve's ``/v1``), so the same workload programs measure them all.

The chat API takes messages, not text, so this backend hands the DSL role markers of its
own (control characters no real text contains) and parses a program's text back into
messages before each call. A ``gen`` therefore has to open an assistant turn: the API has
no way to continue a half-written assistant message. The server applies its own chat
template and its own prefix caching; nothing is sent ahead of a fork.

Gens with tools (and every gen of a conversation after its first tool call) go as a real
agent sends them: the state's messages, with assistant ``tool_calls`` and ``tool`` messages
carrying their ``tool_call_id``, plus ``tools`` / ``tool_choice`` / ``parallel_tool_calls``;
the calls come back from the streamed ``tool_calls`` deltas.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson

from bench_agent.drivers import check_sampling_params
from bench_agent.drivers.streaming import StreamingBackend
from frontend_lang.backend.base import BackendError
from frontend_lang.tools import ToolCall, ToolUse

_ROLES = ("system", "user", "assistant")
_END = "\x1e\x1d"
_MESSAGE = re.compile("\x1e(system|user|assistant)\x1f(.*?)" + _END, re.DOTALL)
_OPEN_ASSISTANT = "\x1eassistant\x1f"
ROLE_MARKERS = {role: [f"\x1e{role}\x1f", _END] for role in _ROLES}


def messages_from_text(text: str) -> list[dict[str, str]]:
    """The conversation encoded in ``text``, which must end by opening an assistant turn."""
    if not text.endswith(_OPEN_ASSISTANT):
        raise BackendError(
            "the OpenAI chat driver generates whole assistant turns only: put gen() right at the start of assistant()"
        )
    body = text[: -len(_OPEN_ASSISTANT)]
    messages, pos = [], 0
    for m in _MESSAGE.finditer(body):
        if m.start() != pos:
            raise BackendError(f"text outside a chat role cannot go to a chat API: {body[pos : m.start()][:60]!r}")
        messages.append({"role": m.group(1), "content": m.group(2)})
        pos = m.end()
    if pos != len(body):
        raise BackendError(f"text outside a chat role cannot go to a chat API: {body[pos:][:60]!r}")
    return messages


def _request_body(model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    check_sampling_params(params, {"max_new_tokens", "temperature", "top_p", "top_k", "ignore_eos", "stop", "seed",
                                   "json_schema", "regex", "n"}, "OpenAI chat")
    if params.get("n", 1) != 1:
        raise BackendError("the OpenAI chat driver streams one choice: gen(n=...) needs the native API")
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": params.get("max_new_tokens", 128),
        "temperature": params.get("temperature", 1.0),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    for key in ("top_p", "stop", "seed"):
        if params.get(key) not in (None, [], ""):
            body[key] = params[key]
    # Not in OpenAI's schema, but vLLM, SGLang, llama.cpp and forkserve all take them; they
    # are only sent when set, so strict servers see a plain request otherwise.
    if params.get("ignore_eos"):
        body["ignore_eos"] = True
    if params.get("json_schema"):  # guided decoding, as OpenAI's structured outputs ask for it
        schema = orjson.loads(params["json_schema"])
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    if params.get("regex"):  # gen(regex=...) and gen_int: vLLM's field and SGLang's (forkserve takes both)
        body["structured_outputs"] = {"regex": params["regex"]}
        body["regex"] = params["regex"]
    if params.get("top_k", -1) not in (-1, 0, None):
        body["top_k"] = params["top_k"]
    return body


def _chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """A state's message as the chat API takes it (an assistant turn of calls has no content)."""
    if message.get("tool_calls") and not message.get("content"):
        return {**message, "content": None}
    return message


class OpenAIChatBackend(StreamingBackend):
    can_cache_prefix = False
    driver_name = "OpenAI chat"

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout: float = 600.0) -> None:
        url = base_url.rstrip("/")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, limits=httpx.Limits(max_connections=512)
        )
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        try:
            resp = self.client.get("/models")
        except httpx.HTTPError as err:
            raise BackendError(f"cannot reach {self.base_url}/models: {err}") from err
        if resp.status_code != 200:  # e.g. a server that wants an API key: say what it said
            raise BackendError(f"{self.base_url}/models answered {resp.status_code}: {resp.text[:500]}")
        models = resp.json().get("data")
        if not models:
            raise BackendError(f"{self.base_url}/models lists no model; pass the model name explicitly")
        return models[0]["id"]

    def role_markers(self) -> dict[str, Any]:
        return ROLE_MARKERS

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], *, program_id: str | None = None
    ) -> Iterator[dict[str, Any]]:
        body = _request_body(self.model, messages_from_text(prompt), sampling_params)
        yield from self._stream(body)

    def generate_chat(
        self, messages: list[dict[str, Any]], sampling_params: dict[str, Any], tools: ToolUse | None, *,
        program_id: str | None = None, stream: bool = False,
    ) -> Iterator[dict[str, Any]]:
        body = _request_body(self.model, [_chat_message(m) for m in messages], sampling_params)
        if tools is not None:
            body.update(tools.request_fields())
        for out in self._stream(body):
            if out.get("final") or stream:
                yield {**out, "prompt": None}

    def chat_text(self, messages: list[dict[str, Any]], tools: ToolUse | None) -> str:
        # This driver sends messages, never this text, once a conversation has tool turns.
        return "".join(f"\x1e{m['role']}\x1f{m.get('content') or ''}{_END}" for m in messages)

    def _stream(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        text, chunks, usage, finish = "", 0, None, None
        calls: dict[int, dict[str, str]] = {}
        start = time.perf_counter()
        try:
            with self.client.stream("POST", "/chat/completions", content=orjson.dumps(body), headers={"content-type": "application/json"}) as resp:
                if resp.status_code != 200:
                    resp.read()
                    raise BackendError(f"{self.base_url}/chat/completions answered {resp.status_code}: {resp.text[:500]}")
                for line in resp.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = orjson.loads(line[len("data: ") :])
                    if "error" in event:
                        raise BackendError(f"{self.base_url} stream failed: {event['error']}")
                    usage = event.get("usage") or usage
                    for choice in event.get("choices") or []:
                        finish = choice.get("finish_reason") or finish
                        delta = choice.get("delta") or {}
                        piece = delta.get("content")
                        for d in delta.get("tool_calls") or []:
                            call = calls.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
                            call["id"] = d.get("id") or call["id"]
                            fn = d.get("function") or {}
                            call["name"] = fn.get("name") or call["name"]
                            call["arguments"] += fn.get("arguments") or ""
                        if piece or delta.get("tool_calls"):
                            # Without token ids, each chunk counts as one token (servers
                            # stream one token per chunk); the final usage has the exact count.
                            text, chunks = text + (piece or ""), chunks + 1
                            yield {"text": text, "meta_info": {"completion_tokens": chunks}}
        except httpx.HTTPError as err:
            raise BackendError(f"cannot reach {self.base_url}/chat/completions: {err}") from err
        details = (usage or {}).get("prompt_tokens_details") or {}
        try:
            tool_calls = [ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())]
        except ValueError as err:
            raise BackendError(f"{self.base_url} sent a tool call whose arguments are not JSON: {err}") from err
        yield {
            "text": text,
            "final": True,
            "content": text,
            "tool_calls": tool_calls,
            "meta_info": {
                "prompt_tokens": (usage or {}).get("prompt_tokens", 0),
                "completion_tokens": (usage or {}).get("completion_tokens", chunks),
                "cached_tokens": details.get("cached_tokens"),
                "finish_reason": finish,
                "e2e_latency": time.perf_counter() - start,
            },
        }

    def end_program(self, program_id: str) -> None:
        pass  # a chat server knows nothing of programs

    def flush_cache(self) -> bool:
        """Empty the server's prefix cache through the first route it has: ``/flush_cache``
        (forkserve, SGLang) or ``/reset_prefix_cache`` (vLLM started with
        ``VLLM_SERVER_DEV_MODE=1``). False when neither answers 200, so that a run after another
        on the same server would find the earlier run's prompts cached."""
        root = self.base_url.removesuffix("/v1")
        for route in ("/flush_cache", "/reset_prefix_cache"):
            try:
                if self.client.post(root + route).status_code == 200:
                    return True
            except httpx.HTTPError:
                return False
        return False

    def shutdown(self) -> None:
        self.client.close()
