"""A running response's hold on its conversation (``POST /v1/responses`` with
``conversation``): while one response runs on a conversation, another one on it is a 400
``conversation_locked``, as OpenAI answers, and not a second answer to the same history whose
items would interleave with the first's.

The hold is taken together with reading the conversation's items (``ConversationStore.hold``,
one atomic update, also across servers sharing a ``--response-store``), renewed every
``RENEW_S`` seconds while the response's requests run and, once its events have begun, until
it is released (a slow reader may be far behind the engine), which happens once its items
have been added, or once its stream ends early (the client gone, even before the stream
began). One that is never released (its server killed) lapses ``ConversationStore.lease``
seconds after its last renewal."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from runtime.server.protocol import ApiError
from runtime.server.response_store import ConversationStore
from runtime.server.scheduler_client import ReqState

logger = logging.getLogger("forkserve")

RENEW_S = 5.0


class ConversationHold:
    """``owner``'s hold on conversation ``conversation_id``; ``items`` are the conversation's
    items as the hold was taken. Call ``watch`` with the response's requests once submitted,
    set ``following`` when its events begin, and call ``release`` when the response has ended.
    Renewal stops at the release, or once the requests have finished if no events began."""

    def __init__(self, conversations: ConversationStore, conversation_id: str, owner: str) -> None:
        self.conversations, self.conversation_id, self.owner = conversations, conversation_id, owner
        self.items: list[dict[str, Any]] = conversations.hold(conversation_id, owner)
        self.states: list[ReqState] | None = None
        self.following = False
        self._renewal: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(self._renew())

    def watch(self, states: list[ReqState]) -> None:
        self.states = states

    async def _renew(self) -> None:
        while self.following or self.states is None or not all(s.is_finished for s in self.states):
            await asyncio.sleep(RENEW_S)
            try:
                self.conversations.hold(self.conversation_id, self.owner)
            except ApiError as err:  # deleted, or taken by another after a lapse: nothing left to hold
                logger.warning("response %s: lost its hold on conversation %s: %s", self.owner,
                               self.conversation_id, err.message)
                return
            except Exception:  # e.g. the store busy beyond its timeout: try again next time
                logger.exception("response %s: renewing its hold on conversation %s failed", self.owner,
                                 self.conversation_id)

    def release(self) -> None:
        """End the hold (again: nothing)."""
        if self._renewal is None:
            return
        self._renewal.cancel()
        self._renewal = None
        self.conversations.release(self.conversation_id, self.owner)
