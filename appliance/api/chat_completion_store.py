"""Stored chat completions (OpenAI's `store: true` on /v1/chat/completions): each answer with
the messages it answered, its metadata and the request's sampling fields, in a JsonStore
(bounded by server.responses' caps, least recently used dropped first, one file each under
<state_dir>/chat_completions, read back after a restart), each readable only by its API key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from .json_store import JsonStore
from .schemas import encoder


class StoredChat(msgspec.Struct, frozen=True):
    completion: dict[str, Any]  # the chat.completion object as answered, with `metadata` and the request's fields
    messages: list[dict[str, Any]]  # the messages it answered, as chat completion store messages (with ids)
    owner: str | None  # the API key id that made it (None: the server has no keys)
    stamp: int  # time.time_ns() when it was stored: the list's order


_record = msgspec.json.Decoder(StoredChat)


def _decoded(completion_id: str, data: bytes) -> tuple[StoredChat, str | None]:
    record = _record.decode(data)
    if record.completion.get("id") != completion_id:
        raise ValueError(f"it holds chat completion {record.completion.get('id')!r}")
    return record, record.owner


class ChatCompletionStore(JsonStore[StoredChat]):
    def __init__(self, max_entries: int, max_bytes: int, directory: Path | None = None):
        super().__init__(max_entries, max_bytes, directory, _decoded, "chat completions")

    def put(self, record: StoredChat) -> bool:
        """False: larger than the whole cap, and not kept."""
        return self.put_record(record.completion["id"], record, record.owner, encoder.encode(record))

    def get(self, completion_id: str, owner: str | None) -> StoredChat:
        return self.get_record(completion_id, owner)

    def listed(self, owner: str | None) -> list[StoredChat]:
        """The owner's stored completions, oldest first (blocking: call it off the event loop)."""
        return sorted((record for _, record in self.readable(owner)), key=lambda r: r.stamp)
