"""Stored conversations (the Conversations API): each one's items in order, the input and output
items of the responses made in it and those added by hand, in a JsonStore (bounded, one file
each, read back after a restart).

A file is the record's JSON on its first line and, after it, one line for each turn added since
(`Turn`: its items and cut), appended rather than the file written again: a turn costs its own
bytes on the disk (an SD card's wear), not the conversation's. A last line a crash cut short
is left out when the file is read."""

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


class Turn(msgspec.Struct, frozen=True):
    """Items added at a conversation's end, as a line appended to its file."""

    items: list[dict[str, Any]]
    cut: str | None = None


_record = msgspec.json.Decoder(ConversationRecord)
_turn = msgspec.json.Decoder(Turn)
log = logging.getLogger("eie.responses")


def _decoded(conversation_id: str, data: bytes) -> tuple[ConversationRecord, str | None]:
    first, *turns = data.split(b"\n")
    record = _record.decode(first)
    if record.conversation.id != conversation_id:
        raise ValueError(f"it holds conversation {record.conversation.id!r}")
    items, cut = list(record.items), record.cut
    for line in turns:
        try:
            turn = _turn.decode(line)
        except msgspec.DecodeError:
            # a turn a crash cut short: left out, as when it was the last line (each later turn
            # was appended after it on a line of its own)
            log.warning("conversation %s: a turn was cut short in its file (a crash?); left out", conversation_id)
            continue
        items += turn.items
        cut = turn.cut or cut
    return msgspec.structs.replace(record, items=items, cut=cut), record.owner


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
        record, added = self.add(self.get(conversation_id, owner), items, cut)
        if not added:
            log.warning("conversation %s is past server.responses.max_mb: %d items were not added",
                        conversation_id, len(items))
        return record

    def add(self, record: ConversationRecord, items: list[dict[str, Any]], cut: str | None = None
            ) -> tuple[ConversationRecord, bool]:
        """`record` with `items` at its end, and whether it was kept (False: larger than the
        whole cap); its file gets them as one appended line."""
        grown = msgspec.structs.replace(record, items=record.items + items, cut=cut or record.cut)
        tail = b"\n" + encoder.encode(Turn(items, cut))
        kept = self.append_record(record.conversation.id, grown, record.owner, tail, lambda: encoder.encode(grown))
        return grown, kept
