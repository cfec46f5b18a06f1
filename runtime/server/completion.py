"""``/v1/completions``: text in, text out (``echo``, ``logprobs`` in OpenAI's legacy shape)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from fastapi.responses import Response

from runtime.server.openai_handler import OpenAIHandler, finish_reason_of
from runtime.server.prompt_logprobs import api_logprob
from runtime.server.protocol import ApiError
from runtime.server.protocol_openai import CompletionRequest
from runtime.server.scheduler_client import ReqState
from runtime.token_bytes import MAX_CHAR_BYTES


class Completion(OpenAIHandler):
    object_name = "text_completion"
    id_prefix = "cmpl"
    req: CompletionRequest
    opened: set[int]  # streamed choices whose first chunk went out (with the echoed prompt, its ids)

    async def run(self) -> Response:
        r = self.req
        self.opened = set()
        self.check_common()
        prompt = r.prompt
        texts: list[str] | None = None
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], str)):
            texts = [prompt] if isinstance(prompt, str) else list(prompt)
            prompts = await self.ctx.encode(texts, r.add_special_tokens is not False, for_generation=True,
                                            keep_end=self.keeps_prompt_end)
        else:
            prompts = list(prompt) if prompt and isinstance(prompt[0], list) else [list(prompt)]
        if not prompts:
            raise ApiError(400, "'prompt' is an empty list", param="prompt")
        states = self.submit(prompts, r.max_tokens, r.logprobs,  # checks token ids
                             prompt_logprobs=r.echo and r.logprobs is not None)
        # Only checked token ids are decoded (for echo); a truncated prompt echoes what was kept.
        texts = texts if r.truncate_prompt_tokens is None else None
        self.prompt_texts = texts or ([self._echoed(p) for p in self.prompts] if r.echo else [])
        return await self.respond(states)

    def _echoed(self, prompt: list[int]) -> str:
        """The text of prompt ids; a partial character at their end is left to the output,
        whose first bytes may complete it (``incremental_text.decode_after``)."""
        text = self.ctx.tokenizer.decode(prompt, False)
        return text[:-1] if text.endswith("\ufffd") and self.ctx.tokenizer.token_bytes.ends_inside_character(prompt) else text

    def echo(self, index: int) -> str:
        return self.prompt_texts[index // self.req.n] if self.req.echo else ""

    def choice(self, index: int, state: ReqState) -> dict[str, Any]:
        echo = self.echo(index)
        logprobs = self.logprobs(state, 0, len(state.output_token_logprobs), len(echo))
        choice = {"index": index, "text": echo + state.text, "logprobs": self.with_prompt(index, state, logprobs),
                  "finish_reason": finish_reason_of(state), **self.prompt_ids_field(index)}
        if self.scores_prompt:
            choice["prompt_logprobs"] = self.vllm_prompt_logprobs(index)
        return choice

    def prompt_ids_field(self, index: int) -> dict[str, Any]:
        """``return_token_ids``: a choice (streamed: its first chunk) names its prompt's ids."""
        return {"prompt_token_ids": self.prompt_ids_of(index)} if self.req.return_token_ids else {}

    def with_prompt(self, index: int, state: ReqState, logprobs: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        """``logprobs`` after the echoed prompt's own (the first token has none), when both
        ``echo`` and ``logprobs`` are asked for."""
        if logprobs is None or not self.req.echo:
            return logprobs
        first = state.first_prompt_token
        token_bytes = self.ctx.tokenizer.token_bytes
        # a special first token the tokenizer added (a BOS) is not in the echoed text
        added = {first} if first in token_bytes.special and not self.echo(index).startswith(
            token_bytes.of(first).decode(errors="replace")) else set()
        scored = self.prompt_state(index)
        prompt = self.entries(scored.input_token_logprobs, scored.input_top_logprobs, 0, unseen=added)
        return {key: prompt[key] + logprobs[key] for key in logprobs}

    def stream_start(self, num_choices: int) -> list[dict[str, Any]]:
        if not self.req.echo or self.req.logprobs is not None:  # with logprobs: echoed with the first chunk
            return []
        self.opened.update(range(num_choices))
        return [{"index": i, "text": self.echo(i), "logprobs": None, "finish_reason": None, **self.prompt_ids_field(i),
                 **({"token_ids": []} if self.req.return_token_ids else {})} for i in range(num_choices)]

    def stream_choice(self, index: int, state: ReqState, text: str, finish: str | None,
                      logprobs: Any) -> dict[str, Any] | None:
        opening = index not in self.opened
        self.opened.add(index)
        if self.req.echo and logprobs is not None:  # the prompt's scores arrive with the first update
            echo = self.echo(index)
            logprobs = {**logprobs, "text_offset": [o + len(echo) for o in logprobs["text_offset"]]}
            if opening:
                text, logprobs = echo + text, self.with_prompt(index, state, logprobs)
        return {**self.delta_choice(index, text, finish, logprobs), **(self.prompt_ids_field(index) if opening else {})}

    def delta_choice(self, index: int, text: str, finish: str | None, logprobs: Any) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def logprobs(self, state: ReqState, start: int, end: int, text_offset: int) -> Any:
        if self.req.logprobs is None:
            return None
        before = [tid for _, tid in state.output_token_logprobs[max(start - MAX_CHAR_BYTES, 0) : start]]
        skipped = self.ctx.tokenizer.token_bytes.special if self.req.skip_special_tokens else ()
        return self.entries(state.output_token_logprobs[start:end],
                            [top or [] for top in state.output_top_logprobs[start:end]], text_offset, before, skipped)

    def entries(self, pairs: Sequence[Any], tops: Sequence[Any], text_offset: int,
                before: Sequence[int] = (), unseen: Collection[int] = ()) -> dict[str, list[Any]]:
        """The legacy completions' logprobs of ``(logprob, token id)`` ``pairs`` with their
        ``tops`` (lists of such pairs, or None). Text offsets are characters of the choice's
        text, from ``text_offset`` on (the tokens ``before`` precede these). As OpenAI has
        it, each top map also holds the chosen token ("up to logprobs + 1 entries")."""
        token_bytes = self.ctx.tokenizer.token_bytes
        names = self.token_name
        tokens, lps, top_maps = [], [], []
        for (lp, tid), top in zip(pairs, tops, strict=True):
            tokens.append(names(tid))
            if lp is None:  # the prompt's first token: nothing to score it against
                lps.append(None)
                top_maps.append(None)
                continue
            lps.append(api_logprob(lp))
            top_maps.append({names(t): api_logprob(v) for v, t in (top or ())[: self.req.logprobs]} | {names(tid): api_logprob(lp)})
        offsets = token_bytes.char_offsets([tid for _, tid in pairs], before, text_offset, unseen)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top_maps, "text_offset": offsets}
