"""Stored conversations (the Conversations API): each one's items in order, the input and output
items of the responses made in it and those added by hand, in a JsonStore (bounded, one file
each, read back after a restart)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec

from .json_store import JsonStore
from .responses_schemas import Conversation
from .schemas import encoder


class ConversationRecord(msgspec.Struct, frozen=True):
    conversation: Conversation
    items: list[dict[str, Any]]  # each with its id, oldest first
    owner: str | None  # the API key id that made it (None: the server has no keys)
    cut: str | None = None  # the item where its last response's prompt started (`truncation: auto`)


_record = msgspec.json.Decoder(ConversationRecord)
log = logging.getLogger("eie.responses")


def _decoded(conversation_id: str, data: bytes) -> tuple[ConversationRecord, str | None]:
    record = _record.decode(data)
    if record.conversation.id != conversation_id:
        raise ValueError(f"it holds conversation {record.conversation.id!r}")
    return record, record.owner


class ConversationStore(JsonStore[ConversationRecord]):
    def __init__(self, max_entries: int, max_bytes: int, directory: Path | None = None):
        super().__init__(max_entries, max_bytes, directory, _decoded, "conversations")

    def put(self, record: ConversationRecord) -> bool:
        """False: it is larger than the whole cap, and not kept."""
        return self.put_record(record.conversation.id, record, record.owner, encoder.encode(record))

    def get(self, conversation_id: str, owner: str | None) -> ConversationRecord:
        return self.get_record(conversation_id, owner)

    def extend(self, conversation_id: str, owner: str | None, items: list[dict[str, Any]],
               cut: str | None = None) -> ConversationRecord:
        """Add `items` at the end (and, where given, the item its latest prompt started at)."""
        record = self.get(conversation_id, owner)
        record = msgspec.structs.replace(record, items=record.items + items, cut=cut or record.cut)
        if not self.put(record):
            log.warning("conversation %s is past server.responses.max_mb: %d items were not added",
                        conversation_id, len(items))
        return record
