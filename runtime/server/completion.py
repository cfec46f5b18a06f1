"""``/v1/completions``: text in, text out (``echo``, ``logprobs`` in OpenAI's legacy shape)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import Response

from runtime.server.openai_handler import OpenAIHandler, finish_reason_of
from runtime.server.protocol import ApiError, reject_unsupported
from runtime.server.scheduler_client import ReqState


class Completion(OpenAIHandler):
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
            "finish_reason": finish_reason_of(state),
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
