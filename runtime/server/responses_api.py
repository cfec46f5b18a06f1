"""``/v1/responses``: OpenAI's Responses API on the chat route's machinery. The request becomes
a chat request (``responses_input.py``); the assistant's answer comes back as output items (a
``reasoning`` item where a reasoning parser split one off, a ``message`` with one
``output_text`` part, a ``function_call`` item per tool call), whole or as the Responses
streaming events (``response.created`` ... ``response.output_text.delta`` ...
``response.completed``). With ``store`` (the default) the response and its conversation are
kept (``response_store.py``) for ``previous_response_id`` and ``GET /v1/responses/{id}``, which
can also send a stored response again as events; ``background`` responses, and stored ones
that are streamed, run as tasks of their own (``responses_background.py``: readable while
they run); a response given ``conversation`` continues from that
conversation's items and, once finished (completed or incomplete; stored or not), adds its
input and output items to it (``conversations_api.py``)."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from runtime.server.chat_completion import ChatCompletion
from runtime.server.context import ServerContext
from runtime.server.conversation_hold import ConversationHold
from runtime.server.openai_constraint import OPENAI_NAMES
from runtime.server.openai_handler import finish_reason_of
from runtime.server.protocol import ApiError, reject_unsupported
from runtime.server.protocol_responses import ResponsesRequest
from runtime.server.response_store import ConversationStore, ResponseStore, check_new_ids
from runtime.server.responses import JsonResponse, error_of, merged_updates, wait_all
from runtime.server.responses_events import CUT_OFF, OutputItems, StreamedOutput, whole_arguments
from runtime.server.responses_input import (
    chat_request,
    input_messages,
    stored_input_items,
)
from runtime.server.scheduler_client import ReqState

if TYPE_CHECKING:
    from runtime.server.responses_background import BackgroundRuns

logger = logging.getLogger("forkserve")

# Sampling fields as Responses clients call them, for error messages.
NAMES = {**OPENAI_NAMES, "max_new_tokens": "max_output_tokens", "json_schema": "text"}


def conversation_id(conversation: str | dict[str, Any] | None) -> str | None:
    """The id a request's ``conversation`` names (its id, or ``{"id": ...}``)."""
    if conversation is None or isinstance(conversation, str):
        return conversation
    if isinstance(conversation.get("id"), str):
        return conversation["id"]
    raise ApiError(400, 'conversation must be an id or {"id": ...}', param="conversation")


class ResponseCreation(OutputItems, ChatCompletion):
    """``POST /v1/responses``."""

    FIELD_NAMES = {"reasoning_effort": "reasoning.effort"}
    api_names = NAMES  # text.format is the only JSON schema field here
    prompt_field = "input"  # type: ignore[assignment]  # where the prompt came from, for its errors

    def __init__(self, ctx: ServerContext, req: ResponsesRequest, request: Request, store: ResponseStore,
                 conversations: ConversationStore, counting: bool = False) -> None:
        """``counting``: only for its prompt (``/v1/responses/input_tokens``): a conversation's
        items are read without holding it, as a response running on it may hold it."""
        ctx.check_model(req.model)
        reject_unsupported(req)
        self.conversation_id = conversation_id(req.conversation)
        if self.conversation_id is not None and req.previous_response_id:
            raise ApiError(400, "give 'conversation' or 'previous_response_id', not both", param="conversation")
        hex_id = uuid.uuid4().hex
        self.hold: ConversationHold | None = None
        items: list[dict[str, Any]] | None = None  # the conversation's
        if self.conversation_id is not None and counting:
            items = conversations.items(self.conversation_id, param="conversation")
        elif self.conversation_id is not None:  # held from here until its items are added (or it fails)
            self.hold = ConversationHold(conversations, self.conversation_id, f"resp_{hex_id}")
            items = self.hold.items
        try:
            history = (input_messages(items, field="conversation") if items is not None else
                       store.conversation(req.previous_response_id) if req.previous_response_id else [])
            chat, self.conversation = chat_request(req, history)  # checks the input items
            super().__init__(ctx, chat, request)
            self.create, self.store, self.conversations = req, store, conversations
            self.hex, self.id = hex_id, f"resp_{hex_id}"  # (in place of the chat handler's own id)
            # the input as the store and a conversation keep it (GET .../input_items)
            self.input_items = stored_input_items(req.input, self.hex)
            if items is not None:
                check_new_ids(items, self.input_items, "input")
        except BaseException:
            self.release_hold()
            raise

    async def prompt_ids(self) -> list[int]:
        """With ``truncation: auto``, a prompt too long for the context with room for the
        answer (``max_output_tokens``, else one token) drops whole turns from the start of
        the conversation, the fewest that make it fit (the instructions and leading system
        messages stay); if not even the last turn fits, the usual 400 follows."""
        ids = await super().prompt_ids()
        room = self.ctx.max_sequence_len - (self.create.max_output_tokens or 1)
        if self.create.truncation != "auto" or len(ids) <= room:
            return ids
        messages = self.req.messages
        kept = 0  # the instructions and the conversation's leading system / developer messages stay
        while kept < len(messages) - 1 and messages[kept].role in ("system", "developer"):
            kept += 1
        turns = [i for i in range(kept + 1, len(messages)) if messages[i].role == "user"]  # where a turn starts
        lo, hi, best = 0, len(turns) - 1, ids
        while lo <= hi:  # the first turn to keep: the earliest that fits (fewer messages, fewer tokens)
            mid = (lo + hi) // 2
            self.req.messages = [*messages[:kept], *messages[turns[mid]:]]
            shorter = await super().prompt_ids()
            if len(shorter) <= room:
                best, hi = shorter, mid - 1
            else:
                lo = mid + 1
        if lo < len(turns):
            self.req.messages = [*messages[:kept], *messages[turns[lo]:]]
            logger.info("response %s: truncation dropped %d of %d messages to fit the context", self.id,
                        turns[lo] - kept, len(messages) - kept)
        else:
            self.req.messages = messages
        return best

    def release_hold(self) -> None:
        if self.hold is not None:
            self.hold.release()

    async def run(self, background: BackgroundRuns) -> Response:
        handed_off = False  # to events(), which releases the conversation's hold when it ends
        try:
            if self.create.background and not self.create.store:
                raise ApiError(400, "a background response is stored: 'background' needs 'store' true",
                               param="background")
            states = await self.start()
            if self.hold:
                self.hold.watch(states)
            if self.create.background or self.req.stream and self.create.store:  # (stored: readable as it runs)
                response = background.start(self, states)
            elif self.req.stream:
                response = StreamingResponse(self.events(states), media_type="text/event-stream")
            else:
                return await self.answer_whole(states)
            handed_off = True
            return response
        finally:
            if not handed_off:
                self.release_hold()

    async def answer_whole(self, states: list[ReqState]) -> Response:
        await wait_all(self.ctx.client, states, self.request)
        state = states[0]
        if not state.is_finished:  # the client left and the request was aborted: nothing to store
            return Response(status_code=499)
        err = error_of(state, NAMES)
        if err is not None:
            raise err
        message, finish = self.answer.message(state.text, finish_reason_of(state))
        logprobs = self.all_logprobs(state)
        output = self.whole_items(message, logprobs, finish)
        return JsonResponse(self.finish(output, finish, states))

    def all_logprobs(self, state: ReqState) -> list[dict[str, Any]] | None:
        """Every output token's logprob entry (None: not asked for)."""
        whole = self.logprobs(state, 0, len(state.output_token_logprobs), 0)
        return whole["content"] if whole else None

    def body(self, output: list[dict[str, Any]], status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        r = self.create
        fmt = r.text.format.model_dump(by_alias=True, exclude_none=True) if r.text and r.text.format else {"type": "text"}
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
            "completed_at": self.completed_at() if status == "completed" else None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": r.instructions, "max_output_tokens": r.max_output_tokens, "model": self.ctx.model_name,
            "output": output, "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id, "reasoning": {"effort": (r.reasoning or {}).get("effort"), "summary": None},
            "store": r.store, "temperature": r.temperature, "text": {"format": fmt}, "tool_choice": r.tool_choice or "auto",
            "tools": r.tools or [], "top_p": r.top_p, "truncation": r.truncation or "disabled", "usage": usage,
            "metadata": r.metadata or {}, "user": r.user, "background": r.background,
            "conversation": {"id": self.conversation_id} if self.conversation_id else None,
        }

    def finish(self, output: list[dict[str, Any]], finish: str | None, states: list[ReqState]) -> dict[str, Any]:
        """The finished response (stored when asked): its usage in the Responses' names."""
        chat = self.usage(states)
        usage = {
            "input_tokens": chat["prompt_tokens"],
            "input_tokens_details": {**chat["prompt_tokens_details"], "cache_write_tokens": 0},
            "output_tokens": chat["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat["total_tokens"],
        }
        if finish == "abort":  # ended by /abort_request: kept as cancelled, part of no conversation
            body = self.body(output, "cancelled", usage)
            if self.create.store:
                self.store.put(body, None, self.input_items)
            return body
        body = self.body(output, "incomplete" if finish == "length" else "completed", usage)
        kept = [i for i in output if i["type"] != "function_call" or whole_arguments(i["arguments"])]
        if self.conversation_id is not None:  # the request's input and the answer join the conversation
            try:
                self.conversations.append(self.conversation_id, [*self.input_items, *kept], param="input")
            except ApiError as err:  # deleted (or dropped) while the response ran: the answer still stands
                logger.warning("response %s: its items were not added to conversation %s: %s", self.id,
                               self.conversation_id, err.message)
        if self.create.store:  # a call cut off by max_output_tokens is not part of the conversation
            answer = input_messages(kept) or [{"role": "assistant", "content": ""}]
            self.store.put(body, [*self.conversation, *answer], self.input_items)
        return body

    # ------------------------------------------------------------------ streaming
    async def events(self, states: list[ReqState], out: StreamedOutput | None = None) -> AsyncIterator[bytes]:
        out = out or StreamedOutput(self)
        if self.hold:  # renewed from now until released below, however slowly the client reads
            self.hold.following = True
        sent_text = sent_tokens = 0
        finish = None
        try:
            yield out.event("response.created", response=self.body([], "in_progress", None))
            yield out.event("response.in_progress", response=self.body([], "in_progress", None))
            async with contextlib.aclosing(merged_updates(self.ctx.client, states)) as updates:
                async for _, s in updates:
                    err = error_of(s, NAMES)
                    if err is not None:
                        yield out.failed(err.status, err.message)
                        return
                    finish = finish_reason_of(s)
                    if len(s.text) == sent_text and finish is None:
                        continue  # no new text yet: its tokens' logprobs go with the next delta
                    logprobs = self.logprobs(s, sent_tokens, len(s.output_token_logprobs), sent_text)
                    if self.answer.is_plain:
                        delta = {"content": s.text[sent_text:]}
                    else:  # tokens and parsed text no longer line up: the logprobs come whole at the end
                        delta, finish = self.answer.delta(0, s.text, finish)
                        delta, logprobs = delta or {}, None
                    sent_text, sent_tokens = len(s.text), len(s.output_token_logprobs)
                    for chunk in (*out.text("reasoning", delta.get("reasoning_content"), None),
                                  *out.text("message", delta.get("content"), logprobs["content"] if logprobs else None),
                                  *out.calls(delta.get("tool_calls") or [])):
                        yield chunk
            for chunk in out.close(incomplete=finish in CUT_OFF, logprobs=self.all_logprobs(states[0])):
                yield chunk
            body = self.finish(out.items, finish, states)
        except Exception as err:  # the stream ends with a terminal event, whatever happened
            yield out.failed(500, f"{type(err).__name__}: {err}")
            raise
        finally:
            self.release_hold()
        if body["status"] != "cancelled":  # as OpenAI's: a cancelled stream has no event of its end
            yield out.event(f"response.{body['status']}", response=body)
