"""The HTTP backend: a forkserve (or SGLang) server's native API."""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson

from frontend_lang.backend.base import Backend, BackendError
from frontend_lang.tools import RenderedChat, ToolUse

logger = logging.getLogger(__name__)

# How SGLang's model gateway (in front of ``forkserve serve --dp-size`` replicas) refuses a
# /generate whose text is a list: a 422 from its own request parser.
_GATEWAY_REFUSES_TEXT_BATCH = "invalid type: sequence"


class RuntimeEndpoint(Backend):
    """A server's native API. ``verify`` (TLS: a CA bundle path, or False) and
    ``chat_template_name`` are SGLang's arguments; roles always use the server's own chat
    template (its markers from ``/get_model_info``), so a template name is not needed here."""

    # Whether /generate takes a list of texts in one request. SGLang's model gateway refuses
    # them; behind one, a list goes as concurrent requests of one text each (which the
    # gateway's cache-aware policy sends where their shared prefix is cached).
    batches_texts = True

    def __init__(self, base_url: str, api_key: str | None = None, verify: str | bool | None = None,
                 chat_template_name: str | None = None, *, timeout: float = 600.0) -> None:
        if not (verify is None or isinstance(verify, (str, bool))):
            raise TypeError(f"RuntimeEndpoint(verify=...) takes a CA bundle's path or a bool, got {verify!r}")
        if isinstance(verify, str):  # a CA bundle, as requests takes it
            verify = ssl.create_default_context(cafile=verify)  # type: ignore[assignment]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.client = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, limits=httpx.Limits(max_connections=512),
            verify=True if verify is None else verify,
        )
        self.model_info = self._get("/get_model_info")
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # sends a batch's texts one each (behind a gateway)
        self.is_shut_down = False
        if chat_template_name is not None:
            logger.warning("RuntimeEndpoint(chat_template_name=%r) is not used: roles follow %s's own chat template",
                           chat_template_name, self.base_url)

    def _check(self, resp: httpx.Response) -> Any:
        if resp.status_code != 200:
            try:
                message = resp.json()["error"]["message"]
            except Exception:
                message = resp.text[:500]
            raise BackendError(f"{self.base_url} answered {resp.status_code}: {message}")
        return resp.json()

    def _get(self, path: str) -> Any:
        try:
            return self._check(self.client.get(path))
        except httpx.HTTPError as err:
            raise BackendError(f"cannot reach {self.base_url}{path}: {err}") from err

    def _post_response(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """The server's answer, whatever its status; BackendError if it cannot be reached."""
        try:
            return self.client.post(path, json=body)
        except httpx.HTTPError as err:
            raise BackendError(f"cannot reach {self.base_url}{path}: {err}") from err

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        return self._check(self._post_response(path, body))

    def generate(
        self,
        prompt: str | list[str],
        sampling_params: dict[str, Any],
        *,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        return_text_in_logprobs: bool = False,
        program_id: str | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        body: dict[str, Any] = {"text": prompt, "sampling_params": sampling_params}
        if return_logprob:
            body.update(
                return_logprob=True,
                logprob_start_len=logprob_start_len,
                top_logprobs_num=top_logprobs_num,
                return_text_in_logprobs=return_text_in_logprobs,
            )
        if program_id is not None:
            body["program_id"] = program_id
        if isinstance(prompt, list) and not self.batches_texts:
            return self._generate_each(body, prompt)
        resp = self._post_response("/generate", body)
        if isinstance(prompt, list) and resp.status_code == 422 and _GATEWAY_REFUSES_TEXT_BATCH in resp.text:
            with self._lock:
                first = self.batches_texts
                self.batches_texts = False
            if first:
                logger.warning("%s refuses a batch of texts (a gateway in front of the servers?): a batch goes as "
                               "one request per text from now on", self.base_url)
            return self._generate_each(body, prompt)
        return self._check(resp)

    def _generate_each(self, body: dict[str, Any], prompts: list[str]) -> list[dict[str, Any]]:
        """``body`` sent once per prompt, all at once; the results in the prompts' order."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="forkserve-dsl-batch")
            pool = self._pool
        return list(pool.map(lambda text: self._post("/generate", {**body, "text": text}), prompts))

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], *, program_id: str | None = None
    ) -> Iterator[dict[str, Any]]:
        body: dict[str, Any] = {"text": prompt, "sampling_params": sampling_params, "stream": True}
        if program_id is not None:
            body["program_id"] = program_id
        try:
            with self.client.stream("POST", "/generate", json=body) as resp:
                if resp.status_code != 200:
                    resp.read()
                    self._check(resp)
                for line in resp.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    payload = line[len("data: ") :]
                    if payload == "[DONE]":
                        return
                    chunk = orjson.loads(payload)
                    if "error" in chunk:
                        raise BackendError(f"{self.base_url} stream failed: {chunk['error'].get('message')}")
                    yield chunk
        except httpx.HTTPError as err:
            raise BackendError(f"cannot reach {self.base_url}/generate: {err}") from err

    def role_markers(self) -> dict[str, Any]:
        roles = self.model_info.get("chat_template_roles")
        if not roles:
            raise BackendError(f"{self.base_url} does not publish its chat template roles; roles need a forkserve server")
        return roles

    def chat_prompt(self, messages: list[dict[str, Any]], tools: ToolUse | None,
                    add_generation_prompt: bool = True) -> RenderedChat:
        body: dict[str, Any] = {"model": self.model_info.get("served_model_name") or self.model_info["model_path"],
                                "messages": messages, "add_generation_prompt": add_generation_prompt,
                                **(tools.request_fields() if tools else {})}
        resp = self._post_response("/v1/chat/completions/render", body)
        if resp.status_code == 404 and not resp.content.strip():  # no such route (the server's own 404s say why)
            raise BackendError(f"{self.base_url} has no /v1/chat/completions/render, where a gen with tools renders "
                               "its chat with the server's template (SGLang's model gateway, as in front of forkserve "
                               "serve --dp-size, does not pass it on): run tool programs against a server's own URL "
                               "(--dp-size prints each replica's)")
        out = self._check(resp)
        return RenderedChat(out["text"], out.get("sampling_params") or {}, out.get("tool_call_parser"))

    def end_program(self, program_id: str) -> None:
        if self.is_shut_down:  # (programs still ending after Ctrl-C) the server lets their pins go in time
            return
        resp = self._post_response("/end_program", {"program_id": program_id})
        if resp.status_code == 404:  # a forkserve server knows the route for any program id
            # SGLang's model gateway (forkserve serve --dp-size) forwards neither the route
            # nor program_id, so nothing was pinned; later programs stop asking.
            self.pins_programs = False
            logger.warning("%s has no /end_program (a gateway in front of the servers?): programs run on it "
                           "without cache pins", self.base_url)
            return
        self._check(resp)

    def flush_cache(self) -> bool:
        return self.client.post("/flush_cache").status_code == 200

    def get_server_info(self) -> dict[str, Any]:
        return self._get("/get_server_info")

    def shutdown(self) -> None:
        self.is_shut_down = True
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self.client.close()
