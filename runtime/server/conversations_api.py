"""OpenAI's Conversations API (``/v1/conversations``): a conversation is a list of items (the
Responses API's: messages, function calls and their outputs, reasoning) kept by the server,
which the Agents SDK's ``OpenAIConversationsSession`` reads and writes as an agent's memory,
and which a response given ``conversation`` continues from and adds its input and output to
(``responses_api.py``). Stored beside the responses (``response_store.py``): in memory, or
in the ``--response-store`` file that servers given it share."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from runtime.server.context import read_body
from runtime.server.protocol import ApiError
from runtime.server.protocol_responses import (
    ConversationCreateRequest,
    ConversationItemsRequest,
    ConversationUpdateRequest,
)
from runtime.server.response_store import ConversationStore
from runtime.server.responses import JsonResponse
from runtime.server.responses_input import input_messages, item_list, item_page, stored_input_items

MAX_ITEMS_PER_ADD = 20  # OpenAI's limit on the items one request adds


def new_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as a conversation keeps them (checked as response input is, each with an id)."""
    if len(items) > MAX_ITEMS_PER_ADD:
        raise ApiError(400, f"at most {MAX_ITEMS_PER_ADD} items can be added at a time, got {len(items)}", param="items")
    input_messages(items, field="items")  # a 400 naming the item it cannot take
    return stored_input_items(items, uuid.uuid4().hex)


def add_routes(app: FastAPI, conversations: ConversationStore, max_request_bytes: int) -> None:
    @app.post("/v1/conversations")
    async def create_conversation(request: Request) -> Response:
        req: ConversationCreateRequest = await read_body(request, ConversationCreateRequest, max_request_bytes)
        return JsonResponse(conversations.create(new_items(req.items or []), req.metadata))

    @app.get("/v1/conversations/{conversation_id}")
    async def get_conversation(conversation_id: str) -> Response:
        return JsonResponse(conversations.get(conversation_id))

    @app.post("/v1/conversations/{conversation_id}")
    async def update_conversation(conversation_id: str, request: Request) -> Response:
        req: ConversationUpdateRequest = await read_body(request, ConversationUpdateRequest, max_request_bytes)
        return JsonResponse(conversations.update(conversation_id, req.metadata))

    @app.delete("/v1/conversations/{conversation_id}")
    async def delete_conversation(conversation_id: str) -> Response:
        conversations.delete(conversation_id)
        return JsonResponse({"id": conversation_id, "object": "conversation.deleted", "deleted": True})

    @app.get("/v1/conversations/{conversation_id}/items")
    async def list_items(conversation_id: str, limit: int = 20, order: str = "desc", after: str | None = None) -> Response:
        return JsonResponse(item_page(conversations.items(conversation_id), limit, order, after,
                                      of=f"conversation '{conversation_id}'"))

    @app.post("/v1/conversations/{conversation_id}/items")
    async def add_items(conversation_id: str, request: Request) -> Response:
        req: ConversationItemsRequest = await read_body(request, ConversationItemsRequest, max_request_bytes)
        conversations.items(conversation_id)  # a 404 before the items are checked
        items = new_items(req.items)
        conversations.append(conversation_id, items, param="items")
        return JsonResponse(item_list(items))

    @app.get("/v1/conversations/{conversation_id}/items/{item_id}")
    async def get_item(conversation_id: str, item_id: str) -> Response:
        return JsonResponse(conversations.item(conversation_id, item_id))

    @app.delete("/v1/conversations/{conversation_id}/items/{item_id}")
    async def delete_item(conversation_id: str, item_id: str) -> Response:
        return JsonResponse(conversations.remove_item(conversation_id, item_id))
