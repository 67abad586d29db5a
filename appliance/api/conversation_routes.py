"""OpenAI's Conversations API: POST /v1/conversations, GET/POST/DELETE
/v1/conversations/{conversation_id}, GET/POST /v1/conversations/{conversation_id}/items and
GET/DELETE /v1/conversations/{conversation_id}/items/{item_id}. A response made with
`conversation` reads its items before its input, and its input and output items are added to
it when it ends (responses_routes.py)."""

from __future__ import annotations

import time

import msgspec

from ..config import Config
from ..observability import context
from . import responses_input
from .conversation_store import ConversationRecord, ConversationStore
from .errors import ApiError, decoded
from .http import Request
from .json_store import MissingRecord, not_found
from .item_pages import item_page
from .responses_schemas import (
    Conversation,
    ConversationCreate,
    ConversationItemsCreate,
    ConversationUpdate,
    DeletedConversation,
    InputItemList,
)

_create = msgspec.json.Decoder(ConversationCreate)
_update = msgspec.json.Decoder(ConversationUpdate)
_add = msgspec.json.Decoder(ConversationItemsCreate)


def _new_items(raw: list, present: list[dict]) -> list[dict]:
    """Items to add (a 400 naming the one this server cannot take, or whose id is taken)."""
    items = responses_input.items(raw, "items")
    responses_input.check_new_ids(items, present, "items")
    return items


def _too_large() -> ApiError:
    return ApiError(413, "the conversation would be larger than this server keeps (server.responses.max_mb)",
                    code="conversation_too_large")


class ConversationRoutes:
    def __init__(self, config: Config, store: ConversationStore):
        self.config = config
        self.store = store

    async def _body(self, request: Request, decoder: msgspec.json.Decoder):
        return decoded(decoder, await request.body(self.config.server.limits.max_body_bytes))

    def _stored(self, request: Request) -> ConversationRecord:
        try:
            return self.store.get(request.path_params["conversation_id"], context.key_id())
        except MissingRecord as e:
            raise not_found("conversation", e) from None

    async def create(self, request: Request) -> None:
        body: ConversationCreate = await self._body(request, _create)
        items = _new_items(body.items or [], [])
        conversation = Conversation(id=responses_input.new_id("conv"), created_at=int(time.time()),
                                    metadata=body.metadata or {})
        self._keep(ConversationRecord(conversation, items, context.key_id()))
        await request.json(200, conversation)

    def _keep(self, record: ConversationRecord) -> None:
        if self.store.max_entries == 0:
            raise ApiError(400, "this server keeps no conversations (server.responses.max_entries is 0)")
        if not self.store.put(record):
            raise _too_large()

    async def retrieve(self, request: Request) -> None:
        await request.json(200, self._stored(request).conversation)

    async def update(self, request: Request) -> None:
        body: ConversationUpdate = await self._body(request, _update)
        record = self._stored(request)
        record = msgspec.structs.replace(record, conversation=msgspec.structs.replace(
            record.conversation, metadata=body.metadata))
        self._keep(record)
        await request.json(200, record.conversation)

    async def delete(self, request: Request) -> None:
        conversation_id = request.path_params["conversation_id"]
        try:
            self.store.delete(conversation_id, context.key_id())
        except MissingRecord as e:
            raise not_found("conversation", e) from None
        await request.json(200, DeletedConversation(conversation_id))

    async def list_items(self, request: Request) -> None:
        await request.json(200, item_page(self._stored(request).items, request, "this conversation"))

    async def add_items(self, request: Request) -> None:
        """Items added at the end: the list of those added."""
        body: ConversationItemsCreate = await self._body(request, _add)
        record = self._stored(request)
        items = _new_items(body.items, record.items)
        if not self.store.add(record, items)[1]:
            raise _too_large()
        await request.json(200, InputItemList(items, items[0]["id"], items[-1]["id"], False))

    def _item_at(self, request: Request, record: ConversationRecord) -> int:
        item_id = request.path_params["item_id"]
        for i, item in enumerate(record.items):
            if item["id"] == item_id:
                return i
        raise ApiError(404, f"no item {item_id!r} in conversation {record.conversation.id!r}", code="item_not_found")

    async def get_item(self, request: Request) -> None:
        record = self._stored(request)
        await request.json(200, record.items[self._item_at(request, record)])

    async def delete_item(self, request: Request) -> None:
        """The item goes; the answer is the conversation."""
        record = self._stored(request)
        at = self._item_at(request, record)
        self._keep(msgspec.structs.replace(record, items=record.items[:at] + record.items[at + 1:]))
        await request.json(200, record.conversation)
