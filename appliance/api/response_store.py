"""Stored Responses API responses: what GET /v1/responses/{id} returns and what
`previous_response_id` continues, in a JsonStore (bounded, least recently used dropped first,
one file each, so a conversation continues across a restart). Each record keeps its own turns
only (its input messages and its answer) and the id of the response before it, so a long
conversation costs its length once, not once per turn."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from .json_store import JsonStore, MissingRecord
from .responses_schemas import Response, ResponseError
from .schemas import ChatMessage, encoder


class Record(msgspec.Struct, frozen=True):
    """A stored response as its file holds it."""

    response: Response
    input_items: list[dict[str, Any]]
    turns: list[ChatMessage]  # this response's input and answer as chat messages
    owner: str | None  # the API key id that made it (None: the server has no keys)
    events: list[msgspec.Raw] | None = None  # a streamed background response's events, once it has ended
    truncated: int = 0  # the conversation's first messages its prompt left out (`truncation: auto`)


_record = msgspec.json.Decoder(Record)
UNFINISHED = ("queued", "in_progress")  # a background response's states before its end


@dataclass(frozen=True)
class Stored:
    response: Response
    input_items: list[dict[str, Any]]
    turns: list[ChatMessage]
    owner: str | None
    events: list[bytes] | None = None  # each stream event's JSON (event_log.py), where they were kept
    truncated: int = 0


MissingResponse = MissingRecord  # its `record_id` is the response's id


def _decoded(response_id: str, data: bytes) -> tuple[Stored, str | None]:
    rec = _record.decode(data)
    if rec.response.id != response_id:
        raise ValueError(f"it holds response {rec.response.id!r}")
    response = rec.response
    if response.status in UNFINISHED:  # a background response the previous run did not finish
        response = msgspec.structs.replace(response, status="failed", error=ResponseError(
            "server_restarted", "the server stopped before this background response finished"))
    events = [bytes(e) for e in rec.events] if rec.events is not None else None
    return Stored(response, rec.input_items, rec.turns, rec.owner, events, rec.truncated), rec.owner


class ResponseStore(JsonStore[Stored]):
    def __init__(self, max_entries: int, max_bytes: int, directory: Path | None = None):
        super().__init__(max_entries, max_bytes, directory, _decoded, "responses")

    def put(self, response: Response, input_items: list[dict[str, Any]], turns: list[ChatMessage],
            owner: str | None, events: list[bytes] | None = None, truncated: int = 0) -> bool:
        """Keep this state of the response (in place of an earlier one); False where it is larger
        than the whole cap (server.responses.max_mb) and not kept."""
        raw = [msgspec.Raw(e) for e in events] if events is not None else None
        data = encoder.encode(Record(response, input_items, turns, owner, raw, truncated))
        return self.put_record(response.id, Stored(response, input_items, turns, owner, events, truncated),
                               owner, data)

    def get(self, response_id: str, owner: str | None) -> Stored:
        """The record, marked as just used; MissingResponse if it is not there for this owner."""
        return self.get_record(response_id, owner)

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
                raise MissingRecord(response_id, f"not continuable: {at!r}, an earlier response of its "
                                                 "conversation, is no longer stored") from None
            chain.append(record)
            at = record.response.previous_response_id
        return [turn for record in reversed(chain) for turn in record.turns]

