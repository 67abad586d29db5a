"""Stored Responses API responses: what GET /v1/responses/{id} returns and what
`previous_response_id` continues, in memory, bounded by count and bytes (oldest use dropped first).

Each record keeps its own turns only (its input messages and its answer) and the id of the
response before it, so a long conversation costs its length once, not once per turn."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .responses_schemas import Response
from .schemas import ChatMessage, encoder


@dataclass(frozen=True)
class Stored:
    response: Response
    input_items: list[dict[str, Any]]
    turns: list[ChatMessage]  # this response's input and answer as chat messages
    owner: str | None  # the API key id that made it (None: the server has no keys)
    size: int  # bytes counted against the store's cap


class MissingResponse(KeyError):
    """A response that is not stored (never was, deleted, dropped, or another key's)."""

    def __init__(self, response_id: str, why: str = "not found"):
        super().__init__(response_id)
        self.response_id = response_id
        self.why = why


class ResponseStore:
    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.dropped = 0  # records dropped to stay under the caps

    def __len__(self) -> int:
        return len(self._records)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, response: Response, input_items: list[dict[str, Any]], turns: list[ChatMessage],
            owner: str | None) -> None:
        size = len(encoder.encode(response)) + len(encoder.encode(input_items)) + len(encoder.encode(turns))
        if self.max_entries == 0 or size > self.max_bytes:
            return
        with self._lock:
            self._records[response.id] = Stored(response, input_items, turns, owner, size)
            self._bytes += size
            self._trim()

    def resize(self, max_entries: int, max_bytes: int) -> None:
        """New caps (a config reload); records over them go now, least recently used first."""
        with self._lock:
            self.max_entries, self.max_bytes = max_entries, max_bytes
            self._trim()

    def _trim(self) -> None:
        while self._records and (len(self._records) > self.max_entries or self._bytes > self.max_bytes):
            _, old = self._records.popitem(last=False)
            self._bytes -= old.size
            self.dropped += 1

    def get(self, response_id: str, owner: str | None) -> Stored:
        """The record, marked as just used; MissingResponse if it is not there for this owner."""
        with self._lock:
            record = self._records.get(response_id)
            if record is None or not _may_read(record, owner):
                raise MissingResponse(response_id)
            self._records.move_to_end(response_id)
            return record

    def delete(self, response_id: str, owner: str | None) -> None:
        with self._lock:
            record = self._records.get(response_id)
            if record is None or not _may_read(record, owner):
                raise MissingResponse(response_id)
            del self._records[response_id]
            self._bytes -= record.size

    def conversation(self, response_id: str, owner: str | None) -> list[ChatMessage]:
        """Every turn up to and including `response_id`'s answer, oldest first (each response's
        `previous_response_id` followed back); every record on the way is marked as used."""
        chain: list[Stored] = []
        seen: set[str] = set()
        at: str | None = response_id
        while at is not None:
            if at in seen:
                break
            seen.add(at)
            try:
                record = self.get(at, owner)
            except MissingResponse:
                if at == response_id:
                    raise
                raise MissingResponse(response_id, f"an earlier response of its conversation, {at!r}, "
                                                   "is no longer stored") from None
            chain.append(record)
            at = record.response.previous_response_id
        return [turn for record in reversed(chain) for turn in record.turns]


def _may_read(record: Stored, owner: str | None) -> bool:
    return record.owner is None or record.owner == owner
